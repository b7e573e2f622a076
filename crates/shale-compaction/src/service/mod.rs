//! Compaction at run time, on every node: the planner records merge operations as tasks in
//! the metastore, workers claim them (any node, with a lease), merge and publish atomically,
//! and the janitor deletes what compaction, retention and crashes leave behind. Everything
//! here does I/O; the decisions are the pure policies of [`crate::policy`].

mod deletes;
mod janitor;
mod manual;
pub mod metrics;
mod planner;
mod worker;

use std::path::PathBuf;
use std::sync::Arc;

use shale_config::CompactionConfig;
use shale_metastore::{Metastore, MetastoreError};
use shale_storage::{IndexStorages, SplitCache};

pub use deletes::{delete_purge_limit, delete_trigger, DeleteCounts, DeleteTrigger, PendingStamps};
pub use janitor::{Janitor, JanitorReport};
pub use manual::manual_round;
pub use planner::{plan_round, RELEASED_FOR_SCOPE_MODE};
pub use worker::{execute_merge, MergeOutcome};

/// Node services compaction uses.
#[derive(Clone)]
pub struct CompactionEnv {
    /// This node's id (merged splits' metadata, `node_local` scopes).
    pub node_id: String,
    /// This incarnation of the node (`node_id#generation`): the owner of the merge tasks it
    /// claims, so that a zombie of an older generation cannot publish them.
    pub worker_id: String,
    /// The metastore, where tasks live (the workers' handle; planning and the janitor use the
    /// leader's fenced handle).
    pub metastore: Arc<dyn Metastore>,
    /// Where each index's splits live.
    pub storages: IndexStorages,
    /// Local cache that merge inputs are downloaded through.
    pub cache: Arc<SplitCache>,
    /// Scratch space for merge outputs (`data_dir/merging`).
    pub scratch_dir: PathBuf,
    /// Settings.
    pub config: CompactionConfig,
    /// Deleted-document counts of splits, kept between planning rounds.
    pub delete_counts: Arc<DeleteCounts>,
}

/// Errors of compaction rounds and merges.
#[derive(Debug, thiserror::Error)]
pub enum CompactionError {
    /// The metastore failed or refused.
    #[error("metastore: {0}")]
    Metastore(#[from] MetastoreError),
    /// Object storage failed.
    #[error("storage: {0}")]
    Storage(#[from] shale_storage::StorageError),
    /// Merging failed.
    #[error("merge: {0}")]
    Index(#[from] shale_index::IndexError),
    /// Merging metrics splits failed (an input is not a readable metrics split).
    #[error("metrics merge: {0}")]
    Metrics(String),
    /// A merge's inputs are gone or replaced: the task cannot succeed.
    #[error("merge task {task_id} cannot be applied: {reason}")]
    Inapplicable {
        /// The task.
        task_id: String,
        /// Why.
        reason: String,
    },
    /// Local disk.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A blocking task panicked or was cancelled.
    #[error("merge task aborted: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// Planning and the janitor run on the leader only.
    #[error("this node is not the cluster's leader")]
    NotLeader,
}

/// What a planning round needs from the cluster: the leader's fenced metastore handle and the
/// ids of the live nodes — `None` while this node does not lead.
pub type PlanningContext =
    Arc<dyn Fn() -> Option<(Arc<dyn Metastore>, std::collections::HashSet<String>)> + Send + Sync>;

/// The running compaction services of a node (planner, workers, janitor loops).
pub struct CompactionService {
    env: Arc<CompactionEnv>,
    janitor: Janitor,
    wake_planner: Arc<tokio::sync::Notify>,
    wake_workers: Arc<tokio::sync::Notify>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl CompactionService {
    /// Starts the planner loop (it plans only while `leader` gives a context, through its
    /// handle) and,
    /// when `run_merges`, the worker loop (the [`Janitor`] is driven by the node, which also
    /// forgets deleted splits in its search caches).
    pub fn start(
        env: CompactionEnv,
        leader: PlanningContext,
        run_merges: bool,
    ) -> CompactionService {
        metrics::register();
        let env = Arc::new(env);
        let wake_planner = Arc::new(tokio::sync::Notify::new());
        let wake_workers = Arc::new(tokio::sync::Notify::new());
        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(planner_loop(
            env.clone(),
            leader,
            wake_planner.clone(),
            wake_workers.clone(),
        )));
        if run_merges && env.config.max_concurrent_merges > 0 {
            tasks.push(tokio::spawn(worker::worker_loop(
                env.clone(),
                wake_workers.clone(),
                wake_planner.clone(),
            )));
        }
        CompactionService {
            janitor: Janitor::new(env.clone()),
            env,
            wake_planner,
            wake_workers,
            tasks,
        }
    }

    /// The janitor.
    pub fn janitor(&self) -> &Janitor {
        &self.janitor
    }

    /// Splits were published: plan again soon.
    pub fn notify_published(&self) {
        self.wake_planner.notify_one();
    }

    /// The environment the services run with.
    pub fn env(&self) -> &Arc<CompactionEnv> {
        &self.env
    }

    /// Wakes the workers (new tasks).
    pub fn wake_workers(&self) {
        self.wake_workers.notify_one();
    }

    /// The notifier that triggers a planning round.
    pub fn planner_notify(&self) -> Arc<tokio::sync::Notify> {
        self.wake_planner.clone()
    }

    /// Stops the loops (running merges are abandoned; their leases expire).
    pub fn stop(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Drop for CompactionService {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn planner_loop(
    env: Arc<CompactionEnv>,
    leader: PlanningContext,
    wake: Arc<tokio::sync::Notify>,
    wake_workers: Arc<tokio::sync::Notify>,
) {
    let interval = std::time::Duration::from_secs(env.config.planner_interval_secs.max(1));
    loop {
        if let Some((metastore, live_nodes)) = leader() {
            let now = shale_types::now_unix_secs();
            match plan_round(&env, &metastore, &live_nodes, now).await {
                Ok(created) if created > 0 => wake_workers.notify_one(),
                Ok(_) => {}
                Err(err) => tracing::warn!(%err, "merge planning round failed"),
            }
            // Manual compactions run whether automatic compaction is on or not.
            match manual_round(&env, &metastore, now).await {
                Ok(created) if created > 0 => wake_workers.notify_one(),
                Ok(_) => {}
                Err(err) => tracing::warn!(%err, "manual compaction round failed"),
            }
        }
        if let Ok(pending) = env
            .metastore
            .list_merge_tasks(None, &[shale_metastore::MergeTaskState::Pending], None)
            .await
        {
            metrics::MERGES_PENDING.set(pending.len() as i64);
        }
        tokio::select! {
            _ = wake.notified() => {
                // Let a burst of publishes settle into one round.
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
