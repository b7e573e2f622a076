//! A fault-injecting HTTP/1.1 reverse proxy in front of the S3-compatible test server, to test
//! how the real parts (the `object_store` S3 client and what Shale builds on it) behave when
//! object storage misbehaves.
//!
//! [`FaultProxy::start`] listens on a free loopback port and forwards every request to the
//! upstream server (e.g. [`crate::s3::endpoint`]) on a connection of its own. Clients keep their
//! connections alive across requests (the proxy parses just enough HTTP/1.1: request and
//! response heads, `Content-Length` and chunked bodies, bodies delimited by the end of the
//! connection, `Expect: 100-continue`). Rules switched at run time inject faults into the
//! requests of given [`RequestKind`]s:
//!
//! | [`Fault`] | what the client sees |
//! |---|---|
//! | `Status(500 \| 503 \| …)` | an S3-style XML error (`InternalError`, `SlowDown`); not forwarded |
//! | `Hold` | no answer at all, until the client gives up and closes; not forwarded |
//! | `HoldAfterForward` | the server did the work, but the answer never comes |
//! | `Reset` | the connection reset (TCP RST) after the request, before any answer; not forwarded |
//! | `ResetMidResponse` | the answer starts, then the connection is reset half-way through it |
//! | `Slow { .. }` | the request body read and the response body sent a few bytes at a time |
//!
//! A [`FaultRule`] fires on a matching request (of its kinds, and optionally whose target
//! contains a string, e.g. one object's key) with a probability, at most a number of times
//! ("the next N requests"), or both; the first rule that fires wins. [`FaultProxy::stats`]
//! counts requests, faults injected and the client's retries of faulted requests (a request
//! repeating the method, target and range of one that got a fault), per kind. Set
//! `SHALE_FAULT_SEED` to replay the same random draws.
//!
//! The proxy runs on a thread and runtime of its own, so it works under any test runtime; it
//! stops, closing every connection it holds, when dropped.
//!
//! ```no_run
//! use shale_testkit::fault_proxy::{Fault, FaultProxy, FaultRule, RequestKind};
//!
//! let upstream = shale_testkit::s3::endpoint().expect("an S3 test server");
//! let proxy = FaultProxy::start(&upstream).expect("start the proxy");
//! proxy.add_rule(FaultRule::new(&[RequestKind::PutObject], Fault::Status(503)).probability(0.3));
//! proxy.add_rule(FaultRule::next(&[RequestKind::RangeGet], Fault::Reset, 2));
//! // … point the S3 client at `proxy.endpoint()` and run the scenario …
//! proxy.clear_rules();
//! eprintln!("{}", proxy.stats());
//! ```

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader,
};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// Longest request or response head accepted.
const MAX_HEAD_BYTES: u64 = 64 * 1024;
/// Buffer size of each direction of a connection.
const BUFFER_BYTES: usize = 64 * 1024;
/// Requests remembered as faulted, to count retries (forgotten all at once beyond).
const MAX_FAULTED_KEYS: usize = 100_000;

/// The kind of an S3 request, as fault rules match it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RequestKind {
    /// `PUT` of a whole object.
    PutObject,
    /// `GET` of a whole object.
    GetObject,
    /// `GET` with a `Range` header.
    RangeGet,
    /// A multipart upload request: create (`?uploads`), part (`?partNumber=…&uploadId=…`),
    /// complete or abort (`?uploadId=…`).
    Multipart,
    /// `HEAD` of an object or bucket.
    Head,
    /// `DELETE` of an object, or a bulk delete (`POST ?delete`).
    Delete,
    /// A listing (`GET` of the bucket, `?list-type=2`).
    List,
    /// Anything else.
    Other,
}

impl RequestKind {
    /// Every kind.
    pub const ALL: [RequestKind; 8] = [
        RequestKind::PutObject,
        RequestKind::GetObject,
        RequestKind::RangeGet,
        RequestKind::Multipart,
        RequestKind::Head,
        RequestKind::Delete,
        RequestKind::List,
        RequestKind::Other,
    ];

    /// The kind's name in [`FaultStats`]' display.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestKind::PutObject => "put",
            RequestKind::GetObject => "get",
            RequestKind::RangeGet => "range_get",
            RequestKind::Multipart => "multipart",
            RequestKind::Head => "head",
            RequestKind::Delete => "delete",
            RequestKind::List => "list",
            RequestKind::Other => "other",
        }
    }

    /// The kind of a request with `method` and `target` (path and query), with or without a
    /// `Range` header.
    pub fn of(method: &str, target: &str, has_range: bool) -> RequestKind {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let has_param = |name: &str| {
            query
                .split('&')
                .any(|pair| pair.split('=').next() == Some(name))
        };
        if has_param("uploads") || has_param("uploadId") || has_param("partNumber") {
            return RequestKind::Multipart;
        }
        // Path-style `/bucket/key`: a path of one segment names the bucket only.
        let segments = path.split('/').filter(|s| !s.is_empty()).count();
        match method {
            "HEAD" => RequestKind::Head,
            "DELETE" => RequestKind::Delete,
            "POST" if has_param("delete") => RequestKind::Delete,
            "GET" if has_param("list-type") || segments <= 1 => RequestKind::List,
            "GET" if has_range => RequestKind::RangeGet,
            "GET" => RequestKind::GetObject,
            "PUT" if segments > 1 => RequestKind::PutObject,
            _ => RequestKind::Other,
        }
    }
}

impl fmt::Display for RequestKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the proxy does to a request a rule fires on.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Answers this status (500, 503, …) with an S3-style XML error body, without forwarding.
    Status(u16),
    /// Reads the request and never answers (until the client closes the connection).
    Hold,
    /// Forwards the request (the server does the work) and never delivers the answer.
    HoldAfterForward,
    /// Reads the request, then resets the connection without answering.
    Reset,
    /// Forwards the request, then resets the connection half-way through the answer.
    ResetMidResponse,
    /// Forwards the request, reading its body and sending the answer's body `chunk_bytes` at
    /// a time with `delay` after each piece.
    Slow {
        /// Bytes per piece.
        chunk_bytes: usize,
        /// Pause after each piece.
        delay: Duration,
    },
}

impl Fault {
    /// The fault's name in [`FaultStats`].
    pub fn name(&self) -> String {
        match self {
            Fault::Status(code) => format!("status_{code}"),
            Fault::Hold => "hold".to_string(),
            Fault::HoldAfterForward => "hold_after_forward".to_string(),
            Fault::Reset => "reset".to_string(),
            Fault::ResetMidResponse => "reset_mid_response".to_string(),
            Fault::Slow { .. } => "slow".to_string(),
        }
    }
}

/// When to inject a fault: into requests of some kinds, with a probability, at most so often.
#[derive(Clone, Debug)]
pub struct FaultRule {
    kinds: Vec<RequestKind>,
    target_contains: Option<String>,
    fault: Fault,
    probability: f64,
    remaining: Option<u64>,
}

impl FaultRule {
    /// Injects `fault` into every request of `kinds`.
    pub fn new(kinds: &[RequestKind], fault: Fault) -> FaultRule {
        FaultRule {
            kinds: kinds.to_vec(),
            target_contains: None,
            fault,
            probability: 1.0,
            remaining: None,
        }
    }

    /// Injects `fault` into the next `n` requests of `kinds`.
    pub fn next(kinds: &[RequestKind], fault: Fault, n: u64) -> FaultRule {
        FaultRule::new(kinds, fault).at_most(n)
    }

    /// Fires on each matching request with probability `p` (0 to 1) only.
    pub fn probability(mut self, p: f64) -> FaultRule {
        self.probability = p.clamp(0.0, 1.0);
        self
    }

    /// Fires only on requests whose target (path and query) contains `needle`, e.g. one
    /// object's key.
    pub fn on_target(mut self, needle: &str) -> FaultRule {
        self.target_contains = Some(needle.to_string());
        self
    }

    /// Fires at most `n` times, then is spent.
    pub fn at_most(mut self, n: u64) -> FaultRule {
        self.remaining = Some(n);
        self
    }

    /// Times it may still fire (`None`: unbounded).
    pub fn remaining(&self) -> Option<u64> {
        self.remaining
    }
}

/// What the proxy saw and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Requests per kind.
    pub requests: BTreeMap<RequestKind, u64>,
    /// Faults injected per kind and fault name.
    pub injected: BTreeMap<(RequestKind, String), u64>,
    /// Per kind, requests repeating one that got a fault (same method, target and range):
    /// the client's retries.
    pub retries: BTreeMap<RequestKind, u64>,
    /// The seed of the random draws (`SHALE_FAULT_SEED` replays them).
    pub seed: u64,
}

impl FaultStats {
    /// Requests of `kind` seen.
    pub fn requests_of(&self, kind: RequestKind) -> u64 {
        self.requests.get(&kind).copied().unwrap_or(0)
    }

    /// Faults injected into requests of `kind`.
    pub fn injected_of(&self, kind: RequestKind) -> u64 {
        self.injected
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|(_, n)| n)
            .sum()
    }

    /// Faults injected, of every kind.
    pub fn total_injected(&self) -> u64 {
        self.injected.values().sum()
    }

    /// Retries of faulted requests of `kind`.
    pub fn retries_of(&self, kind: RequestKind) -> u64 {
        self.retries.get(&kind).copied().unwrap_or(0)
    }

    /// Retries of faulted requests, of every kind.
    pub fn total_retries(&self) -> u64 {
        self.retries.values().sum()
    }
}

impl fmt::Display for FaultStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} faults in {} requests, {} retries of faulted requests (seed {})",
            self.total_injected(),
            self.requests.values().sum::<u64>(),
            self.total_retries(),
            self.seed
        )?;
        for kind in RequestKind::ALL {
            let requests = self.requests_of(kind);
            if requests == 0 {
                continue;
            }
            write!(
                f,
                "\n  {kind}: {requests} requests, {} faults",
                self.injected_of(kind)
            )?;
            let faults: Vec<String> = self
                .injected
                .iter()
                .filter(|((k, _), _)| *k == kind)
                .map(|((_, name), n)| format!("{name} {n}"))
                .collect();
            if !faults.is_empty() {
                write!(f, " ({})", faults.join(", "))?;
            }
            write!(f, ", {} retries", self.retries_of(kind))?;
        }
        Ok(())
    }
}

/// State shared by the proxy's handle and its connections.
struct Shared {
    upstream: String,
    rules: Mutex<Vec<FaultRule>>,
    rng: Mutex<StdRng>,
    stats: Mutex<FaultStats>,
    faulted: Mutex<HashSet<String>>,
    next_request_id: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update is complete before the lock is released.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Counts the request and picks the fault to inject, if any.
    fn decide(&self, kind: RequestKind, target: &str, key: &str) -> Option<Fault> {
        let retry = lock(&self.faulted).contains(key);
        let fault = {
            let mut rules = lock(&self.rules);
            let mut rng = lock(&self.rng);
            rules
                .iter_mut()
                .find(|rule| {
                    rule.kinds.contains(&kind)
                        && rule
                            .target_contains
                            .as_deref()
                            .is_none_or(|needle| target.contains(needle))
                        && rule.remaining != Some(0)
                        && (rule.probability >= 1.0 || rng.random::<f64>() < rule.probability)
                })
                .map(|rule| {
                    if let Some(remaining) = rule.remaining.as_mut() {
                        *remaining -= 1;
                    }
                    rule.fault.clone()
                })
        };
        {
            let mut stats = lock(&self.stats);
            *stats.requests.entry(kind).or_default() += 1;
            if retry {
                *stats.retries.entry(kind).or_default() += 1;
            }
            if let Some(fault) = &fault {
                *stats.injected.entry((kind, fault.name())).or_default() += 1;
            }
        }
        if fault.is_some() {
            let mut faulted = lock(&self.faulted);
            if faulted.len() >= MAX_FAULTED_KEYS {
                faulted.clear();
            }
            faulted.insert(key.to_string());
        }
        fault
    }
}

/// A running fault-injecting proxy; stopped when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port forwarding to `upstream` (`http://host:port`),
    /// injecting nothing until rules are added.
    pub fn start(upstream: &str) -> io::Result<FaultProxy> {
        let upstream = upstream
            .trim_end_matches('/')
            .strip_prefix("http://")
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("the upstream must be http://host:port, not {upstream}"),
                )
            })?
            .to_string();
        let seed = std::env::var("SHALE_FAULT_SEED")
            .ok()
            .and_then(|seed| seed.parse().ok())
            .unwrap_or_else(rand::random::<u64>);
        let shared = Arc::new(Shared {
            upstream,
            rules: Mutex::new(Vec::new()),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            stats: Mutex::new(FaultStats {
                seed,
                ..FaultStats::default()
            }),
            faulted: Mutex::new(HashSet::new()),
            next_request_id: AtomicU64::new(1),
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("s3-fault-proxy".to_string())
            .spawn({
                let shared = shared.clone();
                move || {
                    runtime.block_on(async move {
                        let listener = match TcpListener::from_std(listener) {
                            Ok(listener) => listener,
                            Err(err) => {
                                eprintln!("fault proxy: cannot listen: {err}");
                                return;
                            }
                        };
                        tokio::select! {
                            _ = accept_loop(listener, shared) => {}
                            _ = shutdown_rx => {}
                        }
                    });
                    // Dropping the runtime drops every connection task: sockets close.
                    drop(runtime);
                }
            })?;
        Ok(FaultProxy {
            addr,
            shared,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// The endpoint to give the S3 client: `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address the proxy listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Adds a rule after the existing ones.
    pub fn add_rule(&self, rule: FaultRule) {
        lock(&self.shared.rules).push(rule);
    }

    /// Replaces every rule.
    pub fn set_rules(&self, rules: Vec<FaultRule>) {
        *lock(&self.shared.rules) = rules;
    }

    /// Removes every rule: from now on requests are forwarded untouched (requests already
    /// held stay held until their client gives up).
    pub fn clear_rules(&self) {
        lock(&self.shared.rules).clear();
    }

    /// The rules, with what is left of their budgets.
    pub fn rules(&self) -> Vec<FaultRule> {
        lock(&self.shared.rules).clone()
    }

    /// Counters so far.
    pub fn stats(&self) -> FaultStats {
        lock(&self.shared.stats).clone()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .finish()
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(serve_connection(stream, shared.clone()));
            }
            Err(err) => {
                eprintln!("fault proxy: accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// What to do with a client connection after a request.
enum Next {
    KeepAlive,
    Close,
    Reset,
}

/// Why a body copy stopped early.
enum Stop {
    /// A read or write failed (the connection is dropped).
    Io,
    /// The planned cut of a `ResetMidResponse` was reached.
    Cut,
}

impl From<io::Error> for Stop {
    fn from(_: io::Error) -> Self {
        Stop::Io
    }
}

/// One client connection.
struct Conn {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let (read, writer) = stream.into_split();
    let mut conn = Conn {
        reader: BufReader::with_capacity(BUFFER_BYTES, read),
        writer,
    };
    loop {
        match conn.serve_one(&shared).await {
            Ok(Next::KeepAlive) => continue,
            Ok(Next::Close) | Err(Stop::Io) => {
                let _ = conn.writer.shutdown().await;
                return;
            }
            Ok(Next::Reset) | Err(Stop::Cut) => {
                conn.reset();
                return;
            }
        }
    }
}

impl Conn {
    /// Closes the connection with a TCP reset.
    fn reset(self) {
        if let Ok(stream) = self.reader.into_inner().reunite(self.writer) {
            let _ = stream.set_zero_linger();
        }
    }

    /// Reads and drops the body of a request that is not forwarded.
    async fn drain(&mut self, framing: Framing) -> Result<(), Stop> {
        copy_body(
            &mut self.reader,
            framing,
            &mut Shaper::plain(tokio::io::sink()),
        )
        .await
    }

    /// Waits until the client closes the connection (a held request).
    async fn hold(&mut self) {
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.reader.read(&mut buf).await {
            if n == 0 {
                return;
            }
        }
    }

    async fn serve_one(&mut self, shared: &Shared) -> Result<Next, Stop> {
        let Some(request) = read_head(&mut self.reader).await? else {
            return Ok(Next::Close);
        };
        let mut start = request.start.split_whitespace();
        let method = start.next().unwrap_or_default().to_string();
        let target = start.next().unwrap_or_default().to_string();
        let version = start.next().unwrap_or_default().to_string();
        let range = request.header("range").map(str::to_string);
        let kind = RequestKind::of(&method, &target, range.is_some());
        let key = format!("{method} {target} {}", range.as_deref().unwrap_or(""));
        let fault = shared.decide(kind, &target, &key);
        let client_close = request.has_token("connection", "close")
            || (version == "HTTP/1.0" && !request.has_token("connection", "keep-alive"));
        if request.has_token("expect", "100-continue") {
            self.writer
                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .await?;
        }
        let request_framing = request.request_framing()?;
        let done = if client_close {
            Next::Close
        } else {
            Next::KeepAlive
        };
        match &fault {
            Some(Fault::Status(code)) => {
                self.drain(request_framing).await?;
                let id = shared.next_request_id.fetch_add(1, Ordering::Relaxed);
                self.writer
                    .write_all(&error_response(*code, id, client_close))
                    .await?;
                return Ok(done);
            }
            Some(Fault::Hold) => {
                self.drain(request_framing).await?;
                self.hold().await;
                return Ok(Next::Close);
            }
            Some(Fault::Reset) => {
                self.drain(request_framing).await?;
                return Ok(Next::Reset);
            }
            _ => {}
        }
        let upstream = match TcpStream::connect(&shared.upstream).await {
            Ok(upstream) => upstream,
            Err(_) => {
                self.drain(request_framing).await?;
                let id = shared.next_request_id.fetch_add(1, Ordering::Relaxed);
                self.writer
                    .write_all(&error_response(502, id, client_close))
                    .await?;
                return Ok(done);
            }
        };
        let _ = upstream.set_nodelay(true);
        let (up_read, up_write) = upstream.into_split();
        let mut up_read = BufReader::with_capacity(BUFFER_BYTES, up_read);
        let slow = match &fault {
            Some(Fault::Slow { chunk_bytes, delay }) => Some((*chunk_bytes, *delay)),
            _ => None,
        };
        // The request, on a connection of its own (the upstream may close after each answer).
        let mut to_upstream = Shaper::plain(up_write);
        to_upstream
            .send(&request.to_bytes(
                &["connection", "keep-alive", "proxy-connection", "expect"],
                &[("Connection", "close")],
            ))
            .await?;
        to_upstream.slow = slow;
        copy_body(&mut self.reader, request_framing, &mut to_upstream).await?;
        to_upstream.out.flush().await?;
        // The answer (interim 1xx answers skipped).
        let response = loop {
            let Some(response) = read_head(&mut up_read).await? else {
                return Err(Stop::Io);
            };
            let status = response.status();
            if (100..200).contains(&status) && status != 101 {
                continue;
            }
            break response;
        };
        let response_framing = response.response_framing(&method)?;
        if fault == Some(Fault::HoldAfterForward) {
            copy_body(
                &mut up_read,
                response_framing,
                &mut Shaper::plain(tokio::io::sink()),
            )
            .await?;
            self.hold().await;
            return Ok(Next::Close);
        }
        let close = client_close || matches!(response_framing, Framing::UntilClose);
        let head = response.to_bytes(
            &["connection", "keep-alive"],
            if close {
                &[("Connection", "close")]
            } else {
                &[]
            },
        );
        let mut to_client = Shaper::plain(&mut self.writer);
        if fault == Some(Fault::ResetMidResponse) {
            let head_len = head.len() as u64;
            to_client.cut_at = Some(match response_framing {
                Framing::Length(n) if n >= 2 => head_len + n / 2,
                Framing::Chunked | Framing::UntilClose => head_len + 1,
                Framing::Length(_) | Framing::None => head_len / 2,
            });
        }
        to_client.send(&head).await?;
        to_client.slow = slow;
        copy_body(&mut up_read, response_framing, &mut to_client).await?;
        to_client.out.flush().await?;
        if fault == Some(Fault::ResetMidResponse) {
            return Ok(Next::Reset);
        }
        Ok(if close { Next::Close } else { done })
    }
}

/// An S3-style error answer.
fn error_response(code: u16, request_id: u64, close: bool) -> Vec<u8> {
    let (reason, s3_code, message) = match code {
        500 => (
            "Internal Server Error",
            "InternalError",
            "We encountered an internal error. Please try again.",
        ),
        502 => (
            "Bad Gateway",
            "BadGateway",
            "The fault proxy could not reach the upstream server.",
        ),
        503 => (
            "Service Unavailable",
            "SlowDown",
            "Please reduce your request rate.",
        ),
        _ => ("Error", "InternalError", "Injected error."),
    };
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{s3_code}</Code>\
         <Message>{message} (injected by the shale-testkit fault proxy)</Message>\
         <RequestId>shale-fault-{request_id}</RequestId></Error>"
    );
    let mut head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\
         x-amz-request-id: shale-fault-{request_id}\r\n",
        body.len()
    );
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

/// How a message's body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    /// No body.
    None,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Up to the end of the connection (responses only).
    UntilClose,
}

/// A request or response head: the start line and the headers, in order.
struct Head {
    start: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether a comma-separated header `name` holds `token` (case-insensitive).
    fn has_token(&self, name: &str, token: &str) -> bool {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .flat_map(|(_, v)| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    }

    /// A response's status (0 if unreadable).
    fn status(&self) -> u16 {
        self.start
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    fn content_length(&self) -> io::Result<Option<u64>> {
        self.header("content-length")
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad Content-Length"))
            })
            .transpose()
    }

    fn request_framing(&self) -> io::Result<Framing> {
        if self.has_token("transfer-encoding", "chunked") {
            return Ok(Framing::Chunked);
        }
        Ok(match self.content_length()? {
            Some(0) | None => Framing::None,
            Some(n) => Framing::Length(n),
        })
    }

    fn response_framing(&self, request_method: &str) -> io::Result<Framing> {
        let status = self.status();
        if request_method == "HEAD"
            || (100..200).contains(&status)
            || status == 204
            || status == 304
        {
            return Ok(Framing::None);
        }
        if self.has_token("transfer-encoding", "chunked") {
            return Ok(Framing::Chunked);
        }
        Ok(match self.content_length()? {
            Some(0) => Framing::None,
            Some(n) => Framing::Length(n),
            None => Framing::UntilClose,
        })
    }

    /// The head as bytes, without the headers named in `skip`, with `extra` ones added.
    fn to_bytes(&self, skip: &[&str], extra: &[(&str, &str)]) -> Vec<u8> {
        let mut out = String::with_capacity(256);
        out.push_str(&self.start);
        out.push_str("\r\n");
        for (name, value) in &self.headers {
            if skip.iter().any(|s| name.eq_ignore_ascii_case(s)) {
                continue;
            }
            out.push_str(name);
            out.push_str(": ");
            out.push_str(value);
            out.push_str("\r\n");
        }
        for (name, value) in extra {
            out.push_str(name);
            out.push_str(": ");
            out.push_str(value);
            out.push_str("\r\n");
        }
        out.push_str("\r\n");
        out.into_bytes()
    }
}

/// Reads one line, with its line end; an error at the end of the stream.
async fn read_line_raw<R: AsyncBufRead + Unpin>(reader: &mut R) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let n = (&mut *reader)
        .take(MAX_HEAD_BYTES)
        .read_until(b'\n', &mut line)
        .await?;
    if n == 0 || !line.ends_with(b"\n") {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the stream ended inside a line",
        ));
    }
    Ok(line)
}

/// Reads a message head; `None` when the stream ends before one starts.
async fn read_head<R: AsyncBufRead + Unpin>(reader: &mut R) -> io::Result<Option<Head>> {
    let mut start: Option<String> = None;
    let mut headers = Vec::new();
    let mut total = 0u64;
    loop {
        let mut line = Vec::new();
        let n = (&mut *reader)
            .take(MAX_HEAD_BYTES)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            if start.is_none() {
                return Ok(None);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the stream ended inside a head",
            ));
        }
        total += n as u64;
        if total > MAX_HEAD_BYTES {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "head too long"));
        }
        while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            line.pop();
        }
        let line = String::from_utf8_lossy(&line).into_owned();
        match &start {
            // Blank lines before a message are tolerated (RFC 9112 § 2.2).
            None if line.is_empty() => continue,
            None => start = Some(line),
            Some(_) if line.is_empty() => {
                return Ok(start.map(|start| Head { start, headers }));
            }
            Some(_) => {
                let (name, value) = line.split_once(':').ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidData, "a header line without a colon")
                })?;
                headers.push((name.trim().to_string(), value.trim().to_string()));
            }
        }
    }
}

/// A writer that can trickle what it writes, or stop at a planned cut.
struct Shaper<W> {
    out: W,
    /// Bytes per piece and pause after each.
    slow: Option<(usize, Duration)>,
    /// Total bytes after which to stop ([`Stop::Cut`]).
    cut_at: Option<u64>,
    written: u64,
}

impl<W: AsyncWrite + Unpin> Shaper<W> {
    fn plain(out: W) -> Shaper<W> {
        Shaper {
            out,
            slow: None,
            cut_at: None,
            written: 0,
        }
    }

    async fn send(&mut self, mut data: &[u8]) -> Result<(), Stop> {
        while !data.is_empty() {
            let mut n = data.len();
            if let Some((chunk, _)) = self.slow {
                n = n.min(chunk.max(1));
            }
            if let Some(cut) = self.cut_at {
                let room = cut.saturating_sub(self.written);
                if room == 0 {
                    self.out.flush().await?;
                    return Err(Stop::Cut);
                }
                n = n.min(usize::try_from(room).unwrap_or(usize::MAX));
            }
            self.out.write_all(&data[..n]).await?;
            self.written += n as u64;
            data = &data[n..];
            if let Some((_, delay)) = self.slow {
                self.out.flush().await?;
                tokio::time::sleep(delay).await;
            }
        }
        Ok(())
    }
}

/// Copies exactly `n` body bytes.
async fn copy_exact<R: AsyncBufRead + Unpin, W: AsyncWrite + Unpin>(
    src: &mut R,
    mut n: u64,
    out: &mut Shaper<W>,
) -> Result<(), Stop> {
    while n > 0 {
        let buf = src.fill_buf().await?;
        if buf.is_empty() {
            return Err(Stop::Io);
        }
        let take = buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
        out.send(&buf[..take]).await?;
        src.consume(take);
        n -= take as u64;
    }
    Ok(())
}

/// Copies a body as it is framed (chunk sizes and trailers included).
async fn copy_body<R: AsyncBufRead + Unpin, W: AsyncWrite + Unpin>(
    src: &mut R,
    framing: Framing,
    out: &mut Shaper<W>,
) -> Result<(), Stop> {
    match framing {
        Framing::None => Ok(()),
        Framing::Length(n) => copy_exact(src, n, out).await,
        Framing::Chunked => loop {
            let line = read_line_raw(src).await?;
            out.send(&line).await?;
            let text = String::from_utf8_lossy(&line);
            let size = text.split(';').next().unwrap_or_default().trim();
            let size = u64::from_str_radix(size, 16)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"))?;
            if size == 0 {
                // Trailers, up to the blank line.
                loop {
                    let line = read_line_raw(src).await?;
                    out.send(&line).await?;
                    if line == b"\r\n" || line == b"\n" {
                        return Ok(());
                    }
                }
            }
            copy_exact(src, size, out).await?;
            let end = read_line_raw(src).await?;
            out.send(&end).await?;
        },
        Framing::UntilClose => loop {
            let buf = src.fill_buf().await?;
            if buf.is_empty() {
                return Ok(());
            }
            let n = buf.len();
            out.send(buf).await?;
            src.consume(n);
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_classified_by_kind() {
        use RequestKind::*;
        let cases = [
            ("PUT", "/b/indexes/x/01.split", false, PutObject),
            ("GET", "/b/indexes/x/01.split", false, GetObject),
            ("GET", "/b/indexes/x/01.split", true, RangeGet),
            ("POST", "/b/indexes/x/01.split?uploads", false, Multipart),
            ("PUT", "/b/k?partNumber=2&uploadId=abc", false, Multipart),
            ("POST", "/b/k?uploadId=abc", false, Multipart),
            ("DELETE", "/b/k?uploadId=abc", false, Multipart),
            ("HEAD", "/b/k", false, Head),
            ("DELETE", "/b/k", false, Delete),
            ("POST", "/b?delete", false, Delete),
            ("GET", "/b?list-type=2&prefix=indexes%2F", false, List),
            ("GET", "/b", false, List),
            ("PUT", "/b", false, Other),
        ];
        for (method, target, range, kind) in cases {
            assert_eq!(
                RequestKind::of(method, target, range),
                kind,
                "{method} {target}"
            );
        }
    }

    #[test]
    fn rules_fire_the_next_n_times_then_are_spent() {
        let shared = Shared {
            upstream: String::new(),
            rules: Mutex::new(vec![
                FaultRule::next(&[RequestKind::PutObject], Fault::Status(503), 2),
                FaultRule::new(&[RequestKind::GetObject], Fault::Reset).probability(0.0),
            ]),
            rng: Mutex::new(StdRng::seed_from_u64(7)),
            stats: Mutex::new(FaultStats::default()),
            faulted: Mutex::new(HashSet::new()),
            next_request_id: AtomicU64::new(1),
        };
        assert_eq!(
            shared.decide(RequestKind::PutObject, "/b/a", "a"),
            Some(Fault::Status(503))
        );
        assert_eq!(
            shared.decide(RequestKind::PutObject, "/b/a", "a"),
            Some(Fault::Status(503))
        );
        assert_eq!(shared.decide(RequestKind::PutObject, "/b/a", "a"), None);
        assert_eq!(shared.decide(RequestKind::GetObject, "/b/b", "b"), None);
        lock(&shared.rules)
            .push(FaultRule::new(&[RequestKind::GetObject], Fault::Hold).on_target("/b/x"));
        assert_eq!(
            shared.decide(RequestKind::GetObject, "/b/x", "x"),
            Some(Fault::Hold)
        );
        assert_eq!(shared.decide(RequestKind::GetObject, "/b/y", "y"), None);
        let stats = lock(&shared.stats).clone();
        assert_eq!(stats.requests_of(RequestKind::PutObject), 3);
        assert_eq!(stats.injected_of(RequestKind::PutObject), 2);
        assert_eq!(stats.retries_of(RequestKind::PutObject), 2);
        assert_eq!(stats.injected_of(RequestKind::GetObject), 1);
        assert_eq!(stats.total_injected(), 3);
    }

    /// The data of a chunked body (framing included, as `copy_body` copies it).
    fn dechunk(mut raw: &[u8]) -> Vec<u8> {
        let mut data = Vec::new();
        loop {
            let line_end = raw.windows(2).position(|w| w == b"\r\n").unwrap();
            let size =
                usize::from_str_radix(std::str::from_utf8(&raw[..line_end]).unwrap(), 16).unwrap();
            raw = &raw[line_end + 2..];
            if size == 0 {
                return data;
            }
            data.extend_from_slice(&raw[..size]);
            raw = &raw[size + 2..];
        }
    }

    /// A tiny upstream answering every request with `body`, by Content-Length or chunked, on
    /// connections it closes after each answer.
    async fn upstream(chunked: bool) -> (String, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    let mut reader = BufReader::new(read);
                    let head = read_head(&mut reader).await.unwrap().unwrap();
                    let framing = head.request_framing().unwrap();
                    let mut body = Shaper::plain(Vec::new());
                    let _ = copy_body(&mut reader, framing, &mut body).await;
                    let data = if framing == Framing::Chunked {
                        dechunk(&body.out)
                    } else {
                        body.out
                    };
                    let text = format!("{} got {} bytes", head.start, data.len());
                    let response = if chunked {
                        format!(
                            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{text}\r\n0\r\n\r\n",
                            text.len()
                        )
                    } else {
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                            text.len()
                        )
                    };
                    write.write_all(response.as_bytes()).await.unwrap();
                });
            }
        });
        (format!("http://{addr}"), task)
    }

    #[tokio::test]
    async fn forwards_on_kept_alive_connections_and_injects_faults() {
        for chunked in [false, true] {
            let (endpoint, task) = upstream(chunked).await;
            let proxy = FaultProxy::start(&endpoint).unwrap();
            let client = raw_client::Client::new(proxy.addr()).await;
            let mut client = client;
            // Two requests on one connection, bodies by length and chunked.
            let (status, body) = client.request("PUT /b/k HTTP/1.1", b"hello", false).await;
            assert_eq!(
                (status, body.as_str()),
                (200, "PUT /b/k HTTP/1.1 got 5 bytes")
            );
            let (status, body) = client
                .request("PUT /b/k2 HTTP/1.1", b"hello world", true)
                .await;
            assert_eq!(
                (status, body.as_str()),
                (200, "PUT /b/k2 HTTP/1.1 got 11 bytes")
            );
            proxy.add_rule(FaultRule::next(
                &[RequestKind::PutObject],
                Fault::Status(503),
                1,
            ));
            let (status, body) = client.request("PUT /b/k HTTP/1.1", b"hello", false).await;
            assert_eq!(status, 503);
            assert!(body.contains("<Code>SlowDown</Code>"), "{body}");
            // Still the same connection after the injected error.
            let (status, _) = client.request("PUT /b/k HTTP/1.1", b"hello", false).await;
            assert_eq!(status, 200);
            proxy.add_rule(FaultRule::next(
                &[RequestKind::GetObject],
                Fault::Slow {
                    chunk_bytes: 3,
                    delay: Duration::from_millis(1),
                },
                1,
            ));
            let (status, body) = client.request("GET /b/k HTTP/1.1", b"", false).await;
            assert_eq!(
                (status, body.as_str()),
                (200, "GET /b/k HTTP/1.1 got 0 bytes")
            );
            // A reset mid-response: the client sees the connection end early.
            proxy.add_rule(FaultRule::next(
                &[RequestKind::GetObject],
                Fault::ResetMidResponse,
                1,
            ));
            assert!(client.try_request("GET /b/k HTTP/1.1", b"").await.is_err());
            let stats = proxy.stats();
            assert_eq!(stats.injected_of(RequestKind::PutObject), 1);
            assert_eq!(stats.injected_of(RequestKind::GetObject), 2);
            assert_eq!(stats.retries_of(RequestKind::PutObject), 1);
            drop(proxy);
            task.abort();
        }
    }

    /// A minimal keep-alive HTTP/1.1 client for the proxy's own tests.
    mod raw_client {
        use super::*;

        pub struct Client {
            reader: BufReader<OwnedReadHalf>,
            writer: OwnedWriteHalf,
        }

        impl Client {
            pub async fn new(addr: SocketAddr) -> Client {
                let (read, writer) = TcpStream::connect(addr).await.unwrap().into_split();
                Client {
                    reader: BufReader::new(read),
                    writer,
                }
            }

            pub async fn try_request(
                &mut self,
                start: &str,
                body: &[u8],
            ) -> io::Result<(u16, String)> {
                self.send(start, body, false).await?;
                self.receive().await
            }

            pub async fn request(
                &mut self,
                start: &str,
                body: &[u8],
                chunked: bool,
            ) -> (u16, String) {
                self.send(start, body, chunked).await.unwrap();
                self.receive().await.unwrap()
            }

            async fn send(&mut self, start: &str, body: &[u8], chunked: bool) -> io::Result<()> {
                let mut request = format!("{start}\r\nHost: test\r\n");
                if chunked {
                    request.push_str("Transfer-Encoding: chunked\r\n\r\n");
                    let mut bytes = request.into_bytes();
                    for piece in body.chunks(4) {
                        bytes.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                        bytes.extend_from_slice(piece);
                        bytes.extend_from_slice(b"\r\n");
                    }
                    bytes.extend_from_slice(b"0\r\n\r\n");
                    self.writer.write_all(&bytes).await
                } else {
                    request.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
                    let mut bytes = request.into_bytes();
                    bytes.extend_from_slice(body);
                    self.writer.write_all(&bytes).await
                }
            }

            async fn receive(&mut self) -> io::Result<(u16, String)> {
                let head = read_head(&mut self.reader)
                    .await?
                    .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "no answer"))?;
                assert!(!head.has_token("connection", "close"), "{}", head.start);
                let framing = head.response_framing("GET")?;
                let mut body = Shaper::plain(Vec::new());
                match copy_body(&mut self.reader, framing, &mut body).await {
                    Ok(()) => {}
                    Err(Stop::Io) => return Err(io::Error::other("the body was cut")),
                    Err(Stop::Cut) => unreachable!(),
                }
                // Chunked bodies are copied with their framing.
                let data = if framing == Framing::Chunked {
                    dechunk(&body.out)
                } else {
                    body.out
                };
                let text = String::from_utf8_lossy(&data).into_owned();
                Ok((head.status(), text))
            }
        }
    }
}
