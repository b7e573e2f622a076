//! Membership and leader election through the metastore.
//!
//! At [`Membership::join`] a node registers (its generation grows at every start), then a
//! background task, every `heartbeat_interval_ms`:
//! 1. reads the metastore's clock (the cluster's one clock, see [`shale_types::clock`]), then
//!    heartbeats with what the node reports about itself — if the metastore refuses because a
//!    newer generation of the same node registered, this process is a zombie: the membership
//!    is marked superseded and stops (the node's fenced writes are refused anyway);
//! 2. takes or renews the `leader` lease (`leader_lease_ms` long);
//! 3. lists the nodes and publishes a fresh [`ClusterView`].
//!
//! A node with no heartbeat for `dead_after_ms` is dead for everyone; when the leader dies,
//! its lease lapses after at most `leader_lease_ms` and the next candidate takes it over.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use shale_config::{ClusterConfig, Role};
use shale_metastore::{
    Fence, Lease, Metastore, MetastoreError, NodeIdentity, NodeRecord, LEADER_LEASE,
};
use tokio::sync::watch;
use tracing::{info, warn};

pub use shale_types::clock::now_ms;

/// Reads the metastore's clock and records this machine's offset to it (see
/// [`shale_types::clock`]).
pub async fn sync_clock(metastore: &dyn Metastore) -> Result<(), MetastoreError> {
    let sent = shale_types::clock::local_ms();
    let metastore_ms = metastore.clock_ms().await?;
    let received = shale_types::clock::local_ms();
    shale_types::clock::record_metastore_clock(sent, metastore_ms, received);
    Ok(())
}

/// The cluster as this node last saw it.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterView {
    /// The cluster.
    pub cluster_id: String,
    /// This node's incarnation.
    pub self_identity: NodeIdentity,
    /// Every registered node, live or not, by id.
    pub nodes: Vec<NodeRecord>,
    /// When the view was taken (the cluster's clock).
    pub observed_at_ms: i64,
    /// The liveness threshold.
    pub dead_after_ms: u64,
    /// The leader lease as last seen (its holder may have died since).
    pub leader: Option<Lease>,
}

impl ClusterView {
    /// Whether `node` was live when the view was taken.
    pub fn is_live(&self, node: &NodeRecord) -> bool {
        node.is_live(self.observed_at_ms, self.dead_after_ms)
    }

    /// The live nodes.
    pub fn live_nodes(&self) -> impl Iterator<Item = &NodeRecord> {
        self.nodes.iter().filter(|node| self.is_live(node))
    }

    /// The dead nodes.
    pub fn dead_nodes(&self) -> impl Iterator<Item = &NodeRecord> {
        self.nodes.iter().filter(|node| !self.is_live(node))
    }

    /// The live nodes with `role`.
    pub fn live_with_role(&self, role: Role) -> impl Iterator<Item = &NodeRecord> {
        self.live_nodes()
            .filter(move |node| node.has_role(role.as_str()))
    }

    /// The node `node_id`, if registered.
    pub fn node(&self, node_id: &str) -> Option<&NodeRecord> {
        self.nodes.iter().find(|node| node.node_id == node_id)
    }

    /// Whether `node_id` is registered and live.
    pub fn is_node_live(&self, node_id: &str) -> bool {
        self.node(node_id).is_some_and(|node| self.is_live(node))
    }

    /// The current leader, if its lease is unexpired and it is live.
    pub fn leader_node(&self) -> Option<&NodeRecord> {
        let lease = self.leader.as_ref()?;
        if lease.expires_at_ms <= self.observed_at_ms {
            return None;
        }
        self.live_nodes()
            .find(|node| node.identity() == lease.holder)
    }
}

/// This node's leadership, while it holds the lease.
#[derive(Clone)]
pub struct Leadership {
    /// The lease's fencing token.
    pub fencing_token: u64,
    /// A metastore handle whose writes are refused once the lease is lost.
    pub metastore: Arc<dyn Metastore>,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("fencing_token", &self.fencing_token)
            .finish()
    }
}

/// What a node reports about itself with each heartbeat.
pub type InfoProvider = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// Errors joining a cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The metastore failed.
    #[error("cluster membership: {0}")]
    Metastore(#[from] MetastoreError),
}

/// A node's membership in its cluster.
pub struct Membership {
    metastore: Arc<dyn Metastore>,
    cluster_id: String,
    identity: NodeIdentity,
    config: ClusterConfig,
    view: watch::Sender<Arc<ClusterView>>,
    leadership: watch::Sender<Option<Leadership>>,
    superseded: watch::Sender<bool>,
    info: std::sync::Mutex<Option<InfoProvider>>,
    /// When the last heartbeat the metastore took was sent (this machine's monotonic clock).
    last_heartbeat: std::sync::Mutex<Option<std::time::Instant>>,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("cluster_id", &self.cluster_id)
            .field("identity", &self.identity)
            .finish()
    }
}

impl Membership {
    /// Registers this node (a new generation) and takes a first look at the cluster, trying
    /// the leader lease once. Call [`Membership::start`] to keep it alive.
    pub async fn join(
        metastore: Arc<dyn Metastore>,
        cluster_id: &str,
        node_id: &str,
        advertise_address: &str,
        roles: &[Role],
        config: ClusterConfig,
    ) -> Result<Arc<Membership>, ClusterError> {
        let role_names: Vec<String> = roles.iter().map(|r| r.as_str().to_string()).collect();
        // Every time this node writes is on the metastore's clock, from the first one.
        sync_clock(metastore.as_ref()).await?;
        let record = metastore
            .register_node(
                cluster_id,
                node_id,
                advertise_address,
                &role_names,
                now_ms(),
            )
            .await?;
        let identity = record.identity();
        info!(%identity, cluster_id, advertise_address, "joined the cluster");
        let initial = ClusterView {
            cluster_id: cluster_id.to_string(),
            self_identity: identity.clone(),
            nodes: vec![record],
            observed_at_ms: now_ms(),
            dead_after_ms: config.dead_after_ms,
            leader: None,
        };
        let membership = Arc::new(Membership {
            metastore,
            cluster_id: cluster_id.to_string(),
            identity,
            config,
            view: watch::channel(Arc::new(initial)).0,
            leadership: watch::channel(None).0,
            superseded: watch::channel(false).0,
            info: std::sync::Mutex::new(None),
            last_heartbeat: std::sync::Mutex::new(None),
        });
        membership.tick().await?;
        Ok(membership)
    }

    /// Sets what the node reports with its heartbeats.
    pub fn set_info_provider(&self, provider: InfoProvider) {
        *self.info.lock().unwrap_or_else(|p| p.into_inner()) = Some(provider);
    }

    /// Heartbeats, leader election and view refreshes until the node is superseded or the
    /// task is aborted.
    pub fn start(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let membership = self.clone();
        tokio::spawn(async move {
            let interval = Duration::from_millis(membership.config.heartbeat_interval_ms);
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                match membership.tick().await {
                    Ok(()) => {}
                    Err(ClusterError::Metastore(MetastoreError::FailedPrecondition(reason)))
                        if reason.starts_with("fenced") =>
                    {
                        warn!(identity = %membership.identity, %reason, "superseded by a newer incarnation of this node: stopping");
                        membership.leadership.send_replace(None);
                        membership.superseded.send_replace(true);
                        return;
                    }
                    Err(err) => {
                        warn!(%err, "heartbeat failed; retrying");
                        // A leader that cannot renew must not act past its lease.
                        if membership.leadership.borrow().is_some() {
                            let expired = membership
                                .view
                                .borrow()
                                .leader
                                .as_ref()
                                .is_none_or(|lease| lease.expires_at_ms <= now_ms());
                            if expired {
                                membership.leadership.send_replace(None);
                            }
                        }
                    }
                }
            }
        })
    }

    /// One round: heartbeat, leader lease, view.
    async fn tick(&self) -> Result<(), ClusterError> {
        let info = self
            .info
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|provider| provider())
            .unwrap_or_else(|| serde_json::json!({}));
        sync_clock(self.metastore.as_ref()).await?;
        let sent = std::time::Instant::now();
        self.metastore
            .heartbeat_node(&self.cluster_id, &self.identity, info, now_ms())
            .await?;
        *self
            .last_heartbeat
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(sent);
        let lease = self
            .metastore
            .acquire_lease(
                &self.cluster_id,
                LEADER_LEASE,
                &self.identity,
                self.config.leader_lease_ms,
                now_ms(),
            )
            .await?;
        match &lease {
            Some(lease) => {
                let current = self.leadership.borrow().as_ref().map(|l| l.fencing_token);
                if current != Some(lease.fencing_token) {
                    info!(identity = %self.identity, fencing_token = lease.fencing_token, "became the leader");
                    let metastore = self.metastore.with_fence(Fence::Leader {
                        cluster_id: self.cluster_id.clone(),
                        holder: self.identity.clone(),
                        fencing_token: lease.fencing_token,
                    });
                    self.leadership.send_replace(Some(Leadership {
                        fencing_token: lease.fencing_token,
                        metastore,
                    }));
                }
            }
            None => {
                if self.leadership.borrow().is_some() {
                    info!(identity = %self.identity, "lost the leader lease");
                    self.leadership.send_replace(None);
                }
            }
        }
        let leader = match lease {
            Some(lease) => Some(lease),
            None => {
                self.metastore
                    .get_lease(&self.cluster_id, LEADER_LEASE)
                    .await?
            }
        };
        let nodes = self.metastore.list_nodes(&self.cluster_id).await?;
        self.view.send_replace(Arc::new(ClusterView {
            cluster_id: self.cluster_id.clone(),
            self_identity: self.identity.clone(),
            nodes,
            observed_at_ms: now_ms(),
            dead_after_ms: self.config.dead_after_ms,
            leader,
        }));
        Ok(())
    }

    /// When this node's last heartbeat the metastore took was sent (this machine's
    /// monotonic clock): the others see it live from then for `dead_after_ms`.
    pub fn last_heartbeat_sent(&self) -> Option<std::time::Instant> {
        *self
            .last_heartbeat
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// This node's incarnation.
    pub fn identity(&self) -> &NodeIdentity {
        &self.identity
    }

    /// The cluster id.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// The latest view of the cluster.
    pub fn view(&self) -> Arc<ClusterView> {
        self.view.borrow().clone()
    }

    /// Notified at every new view.
    pub fn subscribe_view(&self) -> watch::Receiver<Arc<ClusterView>> {
        self.view.subscribe()
    }

    /// This node's leadership, if it holds the lease.
    pub fn leadership(&self) -> Option<Leadership> {
        self.leadership.borrow().clone()
    }

    /// Notified when this node gains or loses the lease.
    pub fn subscribe_leadership(&self) -> watch::Receiver<Option<Leadership>> {
        self.leadership.subscribe()
    }

    /// Whether a newer incarnation of this node registered (this one must stop).
    pub fn is_superseded(&self) -> bool {
        *self.superseded.borrow()
    }

    /// Notified when this incarnation is superseded.
    pub fn subscribe_superseded(&self) -> watch::Receiver<bool> {
        self.superseded.subscribe()
    }

    /// A metastore handle whose writes are refused once this incarnation is superseded.
    pub fn node_metastore(&self) -> Arc<dyn Metastore> {
        self.metastore.with_fence(Fence::Node {
            cluster_id: self.cluster_id.clone(),
            identity: self.identity.clone(),
        })
    }

    /// Leaves the cluster (graceful shutdown): gives the leader lease up and records a last
    /// heartbeat at the epoch, so that the others see this node dead at once — the leader
    /// takes over, and this node's shards are replaced, without waiting for `dead_after`.
    pub async fn leave(&self) {
        self.leadership.send_replace(None);
        if let Err(err) = self
            .metastore
            .heartbeat_node(&self.cluster_id, &self.identity, serde_json::json!({}), 0)
            .await
        {
            warn!(%err, "could not record this node's departure");
        }
        if let Err(err) = self
            .metastore
            .release_lease(&self.cluster_id, LEADER_LEASE, &self.identity)
            .await
        {
            warn!(%err, "could not release the leader lease");
        }
    }
}
