//! `shale simulate`: the cluster simulator of `shale_compaction::simulator`, on the same policy
//! and scope code as the node's planner. Writes `DIR/series.csv` (one line per tick),
//! `DIR/summary.json` and `DIR/plot.png` (splits over time), and prints the summary.
//!
//! ```text
//! shale simulate --nodes 3 --ticks 13 --plan-every 13 --docs-per-split 100000 --scope node_local
//! shale simulate --nodes 1000 --days 7 --departures-per-day 24 --scope cluster --out sim
//! shale simulate --nodes 20 --days 1 --departures-per-day 24 --searchers 100 --out sim
//! shale simulate --policy locality --nodes 2 --days 1 --tick-secs 10 --keys 10000 --key-skew 1.1
//! shale simulate --signal metrics --nodes 3 --series 10000 --scrape-interval-secs 10 --days 0.25
//! ```
//!
//! `--signal metrics` models a metrics index (its locality policy: 15-minute buckets, 256 MiB
//! targets) fed by remote write load-balanced over the nodes: every tick each node commits
//! its share of every series' samples, so each fresh split holds keys from the whole series
//! space. It runs node-local and cluster scope on the same samples and reports, for each, the
//! splits a one-series query opens per closed bucket and over the last hour.
//!
//! With a `locality` policy (a policy file, or `--policy locality` for its defaults), the
//! simulation models keys and time buckets (`simulator::locality`): `--keys`, `--key-skew`,
//! `--late-fraction` and `--late-max-secs` shape the documents, and the summary reports the
//! splits a single-key query opens per bucket and over the last hour.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressFinish, ProgressStyle};
use plotters::prelude::*;
use serde_json::Value;
use shale_compaction::policy::{build_policy, MergePolicyConfig};
use shale_compaction::simulator::locality::{
    simulate_locality_with_progress, LocalitySimulationConfig,
};
use shale_compaction::simulator::{self, SimulationConfig, SimulationReport, TickStats};

use crate::plan::{exit_on_input_error, load_policy_file, InputError, LoadedPolicy, ScopeArg};

#[derive(clap::Args)]
pub struct SimulateArgs {
    /// Live nodes (departed nodes are replaced, so this stays constant).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Ticks to simulate.
    #[arg(long, required_unless_present = "days", conflicts_with = "days")]
    ticks: Option<u64>,
    /// Simulated days, instead of `--ticks`.
    #[arg(long)]
    days: Option<f64>,
    /// Seconds per tick; every live node commits one split per tick.
    #[arg(long, default_value_t = 60)]
    tick_secs: u64,
    /// Documents per committed split.
    #[arg(long, default_value_t = 100_000)]
    docs_per_split: u64,
    /// Bytes per document (a split's size is docs × this).
    #[arg(long, default_value_t = 300)]
    bytes_per_doc: u64,
    /// Ticks between planning rounds.
    #[arg(long, default_value_t = 1)]
    plan_every: u64,
    /// Merge scope mode.
    #[arg(long, value_enum, default_value_t = ScopeArg::Cluster)]
    scope: ScopeArg,
    /// Policy file, as for `shale plan`, or a policy type with its defaults (`stable_log`,
    /// `limit_merge`, `no_merge`, `locality`). Default: `stable_log`, 10 000 000 docs.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Locality: distinct keys (combinations of sort field values).
    #[arg(long, default_value_t = 10_000)]
    keys: u32,
    /// Locality: Zipf exponent of the key frequencies (0: uniform; 1: a few keys dominate).
    #[arg(long, default_value_t = 1.0)]
    key_skew: f64,
    /// Locality: fraction of documents arriving late.
    #[arg(long, default_value_t = 0.05)]
    late_fraction: f64,
    /// Locality: how old a late document may be, in seconds.
    #[arg(long, default_value_t = 3600)]
    late_max_secs: u64,
    /// Nodes that depart per simulated day, each replaced by a node with a new id.
    #[arg(long, default_value_t = 0.0)]
    departures_per_day: f64,
    /// Seed of the choice of departing nodes.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Unix time at which the simulation starts.
    #[arg(long, default_value_t = SimulationConfig::default().start_timestamp)]
    start: i64,
    /// Searchers to simulate queries on (0: none).
    #[arg(long, default_value_t = 0)]
    searchers: usize,
    /// Searchers that depart per simulated day, each replaced by a new one with an empty
    /// cache (default: as `--departures-per-day`).
    #[arg(long)]
    searcher_departures_per_day: Option<f64>,
    /// Ticks between simulated queries (a query opens every existing split).
    #[arg(long, default_value_t = 60)]
    query_every: u64,
    /// Output directory (created if needed).
    #[arg(long, default_value = "simulation")]
    out: PathBuf,
    /// What the index holds: `logs` (documents, the policy of `--policy`) or `metrics`
    /// (series samples under a metrics index's locality policy, both scopes compared).
    #[arg(long, value_enum, default_value_t = Signal::Logs)]
    signal: Signal,
    /// Metrics: series written.
    #[arg(long, default_value_t = 10_000)]
    series: u32,
    /// Metrics: seconds between two samples of a series.
    #[arg(long, default_value_t = 10)]
    scrape_interval_secs: u64,
    /// Metrics: fraction of the series replaced by new ones per hour.
    #[arg(long, default_value_t = 0.0)]
    churn_per_hour: f64,
    /// Metrics: bytes per sample on storage.
    #[arg(long, default_value_t = 1.5)]
    bytes_per_sample: f64,
}

/// The kind of data simulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Signal {
    /// Documents (logs, traces).
    Logs,
    /// Metric samples.
    Metrics,
}

/// Runs `shale simulate`.
pub async fn run(args: SimulateArgs) -> anyhow::Result<()> {
    exit_on_input_error(simulate(args))
}

fn simulate(args: SimulateArgs) -> anyhow::Result<()> {
    let loaded = match &args.policy {
        Some(path) => load_policy_arg(path)?,
        None => LoadedPolicy::default(),
    };
    let ticks = match (args.ticks, args.days) {
        (Some(ticks), _) => ticks,
        (None, Some(days)) if days.is_finite() && days > 0.0 && args.tick_secs > 0 => {
            ((days * 86_400.0) / args.tick_secs as f64).ceil() as u64
        }
        (None, Some(days)) => {
            return Err(
                InputError(format!("--days: expected a positive number, got {days}")).into(),
            )
        }
        (None, None) => return Err(InputError("give --ticks or --days".to_string()).into()),
    };
    if args.signal == Signal::Metrics {
        return simulate_metrics(&args, ticks);
    }
    if let MergePolicyConfig::Locality(locality) = &loaded.config {
        return simulate_locality(&args, ticks, locality);
    }
    let config = SimulationConfig {
        nodes: args.nodes,
        ticks,
        tick_secs: args.tick_secs,
        docs_per_split: args.docs_per_split,
        bytes_per_doc: args.bytes_per_doc,
        plan_every: args.plan_every,
        node_local: args.scope.node_local(),
        departures_per_day: args.departures_per_day,
        seed: args.seed,
        start_timestamp: args.start,
        searchers: args.searchers,
        searcher_departures_per_day: args
            .searcher_departures_per_day
            .unwrap_or(args.departures_per_day),
        query_every: args.query_every,
    };
    config.validate().map_err(flag_error)?;
    let started = Instant::now();
    let bar = tick_bar(config.ticks, config.tick_secs, "")?;
    let report = simulator::simulate_with_progress(
        &config,
        loaded.policy.as_ref(),
        &mut tick_progress(&bar),
    )
    .map_err(|err| InputError(err.to_string()))?;
    bar.finish_and_clear();
    let elapsed = started.elapsed();

    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let series_path = args.out.join("series.csv");
    std::fs::write(&series_path, simulator::series_csv(&report.series))
        .with_context(|| format!("cannot write {}", series_path.display()))?;
    let summary = summary_json(&report, &config, &loaded)?;
    let summary_text = serde_json::to_string_pretty(&summary)?;
    let summary_path = args.out.join("summary.json");
    std::fs::write(&summary_path, format!("{summary_text}\n"))
        .with_context(|| format!("cannot write {}", summary_path.display()))?;
    let plot_path = args.out.join("plot.png");
    plot(&plot_path, &report, &config, &loaded)
        .with_context(|| format!("cannot draw {}", plot_path.display()))?;
    println!("{summary_text}");
    eprintln!(
        "simulated {} ticks ({:.1} days) of {} nodes in {:.2} s; wrote {}, {} and {}",
        config.ticks,
        (config.ticks * config.tick_secs) as f64 / 86_400.0,
        config.nodes,
        elapsed.as_secs_f64(),
        series_path.display(),
        summary_path.display(),
        plot_path.display()
    );
    Ok(())
}

/// A progress bar of the simulated ticks on stderr (drawn on a terminal only, as indicatif
/// does), with the simulated time reached; cleared when dropped; `prefix` names the run.
fn tick_bar(ticks: u64, tick_secs: u64, prefix: &str) -> anyhow::Result<ProgressBar> {
    if ticks == 0 {
        return Ok(ProgressBar::hidden());
    }
    let total_secs = ticks.saturating_mul(tick_secs);
    let style = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {prefix}{wide_bar} {pos}/{len} ticks, {simulated}",
    )?
    .with_key(
        "simulated",
        move |state: &indicatif::ProgressState, out: &mut dyn std::fmt::Write| {
            let reached = state.pos().saturating_mul(tick_secs);
            let _ = out.write_str(&simulated_time(reached, total_secs));
        },
    );
    let bar = ProgressBar::new(ticks)
        .with_style(style)
        .with_finish(ProgressFinish::AndClear);
    if !prefix.is_empty() {
        bar.set_prefix(format!("{prefix} "));
    }
    Ok(bar)
}

/// The callback the simulation loop calls after each tick: moves `bar` to the ticks done.
fn tick_progress(bar: &ProgressBar) -> impl FnMut(u64) + '_ {
    move |done| bar.set_position(done)
}

/// `simulated 1d 02:30 of 7d 00:00`: the simulated time reached, in days, hours and minutes.
fn simulated_time(reached_secs: u64, total_secs: u64) -> String {
    let dhm = |secs: u64| {
        format!(
            "{}d {:02}:{:02}",
            secs / 86_400,
            secs % 86_400 / 3600,
            secs % 3600 / 60
        )
    };
    format!("simulated {} of {}", dhm(reached_secs), dhm(total_secs))
}

/// An invalid simulation setting, named by its command-line flag.
fn flag_error(err: simulator::SimulationError) -> InputError {
    let simulator::SimulationError::Invalid { field, message } = err;
    InputError(format!("--{}: {message}", field.replace('_', "-")))
}

/// A policy file, or the name of a policy type (its defaults; `locality` on one key field).
fn load_policy_arg(path: &Path) -> anyhow::Result<LoadedPolicy> {
    let name = path.to_str().unwrap_or_default();
    let known = [
        "stable_log",
        "default",
        "limit_merge",
        "no_merge",
        "locality",
    ];
    if path.exists() || !known.contains(&name) {
        return load_policy_file(path);
    }
    let mut block = serde_json::json!({"type": name});
    if name == "locality" {
        block["sort_fields"] = serde_json::json!(["key"]);
    }
    let config = MergePolicyConfig::parse(&block)
        .map_err(|err| InputError(format!("--policy {name}: {}", err.message)))?;
    let split_num_docs_target = shale_config::DEFAULT_SPLIT_NUM_DOCS_TARGET;
    Ok(LoadedPolicy {
        policy: build_policy(&config, split_num_docs_target),
        config,
        split_num_docs_target,
    })
}

/// The locality simulation: keys, buckets, late data.
fn simulate_locality(
    args: &SimulateArgs,
    ticks: u64,
    policy: &shale_config::LocalityConfig,
) -> anyhow::Result<()> {
    let config = LocalitySimulationConfig {
        nodes: args.nodes,
        ticks,
        tick_secs: args.tick_secs,
        docs_per_split: args.docs_per_split,
        bytes_per_doc: args.bytes_per_doc,
        plan_every: args.plan_every,
        keys: args.keys,
        key_skew: args.key_skew,
        late_fraction: args.late_fraction,
        late_max_secs: args.late_max_secs,
        seed: args.seed,
        start_timestamp: args.start,
        node_local: args.scope.node_local(),
        churn_per_hour: 0.0,
    };
    let started = Instant::now();
    let bar = tick_bar(config.ticks, config.tick_secs, "")?;
    let report = simulate_locality_with_progress(&config, policy, &mut tick_progress(&bar))
        .map_err(flag_error)?;
    bar.finish_and_clear();
    let elapsed = started.elapsed();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut csv = String::from(
        "tick,timestamp,total_splits,level0_splits,last_hour_splits,last_hour_key_query_splits,merges,write_amplification\n",
    );
    for row in &report.series {
        csv.push_str(&format!(
            "{},{},{},{},{},{:.2},{},{:.4}\n",
            row.tick,
            row.timestamp,
            row.total_splits,
            row.level0_splits,
            row.last_hour_splits,
            row.last_hour_key_query_splits,
            row.merges,
            row.write_amplification
        ));
    }
    let series_path = args.out.join("series.csv");
    std::fs::write(&series_path, csv)
        .with_context(|| format!("cannot write {}", series_path.display()))?;
    let mut summary = serde_json::to_value(&report.summary)?;
    if let Value::Object(object) = &mut summary {
        object.insert("policy".into(), "locality".into());
        object.insert("merge_policy".into(), policy.to_json());
        object.insert("tick_secs".into(), config.tick_secs.into());
        object.insert("docs_per_split".into(), config.docs_per_split.into());
        object.insert("late_max_secs".into(), config.late_max_secs.into());
        object.insert("seed".into(), config.seed.into());
    }
    let summary_text = serde_json::to_string_pretty(&summary)?;
    let summary_path = args.out.join("summary.json");
    std::fs::write(&summary_path, format!("{summary_text}\n"))
        .with_context(|| format!("cannot write {}", summary_path.display()))?;
    println!("{summary_text}");
    eprintln!(
        "simulated {} ticks ({:.1} days) of {} nodes with {} keys in {:.2} s; wrote {} and {}",
        config.ticks,
        (config.ticks * config.tick_secs) as f64 / 86_400.0,
        config.nodes,
        config.keys,
        elapsed.as_secs_f64(),
        series_path.display(),
        summary_path.display()
    );
    Ok(())
}

/// The metrics simulation: the same series samples under a metrics index's locality policy,
/// in node-local then cluster scope.
fn simulate_metrics(args: &SimulateArgs, ticks: u64) -> anyhow::Result<()> {
    if args.scrape_interval_secs == 0 {
        return Err(InputError("--scrape-interval-secs: must be at least 1".to_string()).into());
    }
    if !args.bytes_per_sample.is_finite() || args.bytes_per_sample <= 0.0 {
        return Err(InputError("--bytes-per-sample: must be a positive number".to_string()).into());
    }
    let metrics = shale_config::MetricsSettings::default();
    let mut policy = metrics.locality_config();
    // Sizes are counted in samples: the byte target as samples of `--bytes-per-sample`.
    policy.target_split_bytes = None;
    policy.target_split_num_docs =
        Some(((metrics.target_split_bytes as f64 / args.bytes_per_sample) as u64).max(1));
    // Each node's share of every series' samples of one tick (remote write spread evenly).
    let samples_per_tick =
        u64::from(args.series) * args.tick_secs / args.scrape_interval_secs.max(1);
    let docs_per_split = (samples_per_tick / args.nodes.max(1) as u64).max(1);
    let mut runs = Vec::new();
    for node_local in [true, false] {
        let config = LocalitySimulationConfig {
            nodes: args.nodes,
            ticks,
            tick_secs: args.tick_secs,
            docs_per_split,
            bytes_per_doc: 1,
            plan_every: args.plan_every,
            keys: args.series,
            key_skew: 0.0,
            late_fraction: 0.0,
            late_max_secs: args.late_max_secs,
            seed: args.seed,
            start_timestamp: args.start,
            node_local,
            churn_per_hour: args.churn_per_hour,
        };
        let started = Instant::now();
        let scope = if node_local { "node_local" } else { "cluster" };
        let bar = tick_bar(ticks, args.tick_secs, scope)?;
        let report = simulate_locality_with_progress(&config, &policy, &mut tick_progress(&bar))
            .map_err(flag_error)?;
        bar.finish_and_clear();
        eprintln!(
            "simulated {} scope: {} ticks of {} nodes, {} series, in {:.2} s",
            report.summary.scope,
            ticks,
            args.nodes,
            args.series,
            started.elapsed().as_secs_f64()
        );
        runs.push(report);
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let summaries: Vec<Value> = runs
        .iter()
        .map(|run| serde_json::to_value(&run.summary))
        .collect::<Result<_, _>>()?;
    let summary = serde_json::json!({
        "signal": "metrics",
        "series": args.series,
        "scrape_interval_secs": args.scrape_interval_secs,
        "churn_per_hour": args.churn_per_hour,
        "samples_per_split": docs_per_split,
        "target_split_samples": policy.target_split_num_docs,
        "runs": summaries,
    });
    let summary_text = serde_json::to_string_pretty(&summary)?;
    let summary_path = args.out.join("summary.json");
    std::fs::write(&summary_path, format!("{summary_text}\n"))
        .with_context(|| format!("cannot write {}", summary_path.display()))?;
    println!(
        "{:<11} {:>14} {:>16} {:>22} {:>22}",
        "scope", "final splits", "level-0 splits", "one series/bucket", "one series, last 1 h"
    );
    for run in &runs {
        let s = &run.summary;
        println!(
            "{:<11} {:>14} {:>16} {:>22.2} {:>22.2}",
            s.scope,
            s.final_splits,
            s.final_level0_splits,
            s.key_query_splits_per_bucket,
            s.last_hour_key_query_splits
        );
    }
    eprintln!("wrote {}", summary_path.display());
    Ok(())
}

/// The summary plus the settings that produced it.
fn summary_json(
    report: &SimulationReport,
    config: &SimulationConfig,
    loaded: &LoadedPolicy,
) -> anyhow::Result<Value> {
    let mut summary = serde_json::to_value(&report.summary)?;
    if let Value::Object(object) = &mut summary {
        object.insert("policy".into(), loaded.config.type_name().into());
        object.insert(
            "split_num_docs_target".into(),
            loaded.split_num_docs_target.into(),
        );
        object.insert("tick_secs".into(), config.tick_secs.into());
        object.insert("docs_per_split".into(), config.docs_per_split.into());
        object.insert("bytes_per_doc".into(), config.bytes_per_doc.into());
        object.insert("plan_every".into(), config.plan_every.into());
        object.insert(
            "departures_per_day".into(),
            serde_json::json!(config.departures_per_day),
        );
        object.insert("seed".into(), config.seed.into());
    }
    Ok(summary)
}

/// Registers the embedded DejaVu Sans as plotters' `sans-serif` (plotters' `ab_glyph` backend
/// has no system fonts, which keeps the plot identical on every machine).
fn register_font() -> anyhow::Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .is_ok()
    });
    anyhow::ensure!(ok, "the embedded font could not be loaded");
    Ok(())
}

/// Two panels over simulated hours: all splits and the last hour's; immature and orphaned
/// ones.
fn plot(
    path: &Path,
    report: &SimulationReport,
    config: &SimulationConfig,
    loaded: &LoadedPolicy,
) -> anyhow::Result<()> {
    register_font()?;
    let root = BitMapBackend::new(path, (1280, 860)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "{} nodes, {} scope, {}, {} docs/split every {} s, {} departures/day",
        config.nodes,
        config.scope_name(),
        loaded.config.type_name(),
        config.docs_per_split,
        config.tick_secs,
        config.departures_per_day
    );
    let (top, bottom) = {
        let root = root.titled(&title, ("sans-serif", 22))?;
        root.split_vertically(430)
    };
    let hours = |row: &TickStats| (row.timestamp - config.start_timestamp) as f64 / 3600.0;
    let x_max = report.series.last().map_or(1.0, hours).max(1e-3);
    let panels: [(&DrawingArea<BitMapBackend, _>, &str, Vec<Curve>); 2] = [
        (
            &top,
            "splits",
            vec![
                Curve::new("total splits", BLUE, |row| row.total_splits),
                Curve::new("splits a last-hour query opens", GREEN, |row| {
                    row.last_hour_splits
                }),
            ],
        ),
        (
            &bottom,
            "splits",
            vec![
                Curve::new("immature splits", MAGENTA, |row| row.immature_splits),
                Curve::new("orphaned splits (immature)", RED, |row| row.orphaned_splits),
                Curve::new("splits ever orphaned", BLACK, |row| {
                    row.orphaned_splits_total
                }),
            ],
        ),
    ];
    for (area, y_label, curves) in panels {
        let y_max = curves
            .iter()
            .flat_map(|curve| report.series.iter().map(|row| (curve.value)(row)))
            .max()
            .unwrap_or(0)
            .max(1) as f64
            * 1.08;
        let mut chart = ChartBuilder::on(area)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_desc("simulated hours")
            .y_desc(y_label)
            .y_label_formatter(&|value| format!("{value:.0}"))
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 16))
            .draw()?;
        for curve in curves {
            let color = curve.color;
            chart
                .draw_series(LineSeries::new(
                    report
                        .series
                        .iter()
                        .map(|row| (hours(row), (curve.value)(row) as f64)),
                    color.stroke_width(1),
                ))?
                .label(curve.label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

struct Curve {
    label: &'static str,
    color: RGBColor,
    value: fn(&TickStats) -> u64,
}

impl Curve {
    fn new(label: &'static str, color: RGBColor, value: fn(&TickStats) -> u64) -> Self {
        Curve {
            label,
            color,
            value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_message_shows_the_simulated_time_reached() {
        assert_eq!(
            simulated_time(0, 7 * 86_400),
            "simulated 0d 00:00 of 7d 00:00"
        );
        assert_eq!(
            simulated_time(86_400 + 2 * 3600 + 30 * 60 + 59, 7 * 86_400),
            "simulated 1d 02:30 of 7d 00:00"
        );
    }

    #[test]
    fn the_bar_follows_the_ticks_the_simulation_reports() {
        let bar = tick_bar(10, 60, "cluster").unwrap();
        let mut progress = tick_progress(&bar);
        progress(4);
        assert_eq!(bar.position(), 4);
        assert_eq!(bar.length(), Some(10));
    }
}
