//! The gate every request of every listener passes (REST, OTLP/gRPC, the internal API): who
//! may call what, and what a browser may not do from another site.
//!
//! - Routes are only added through [`ApiRoutes`], which records the [`Access`] each (method,
//!   path) needs. The assembly turns that table into a [`Gate`] and puts [`gate`] around the
//!   whole router, so a route cannot exist outside it; a (method, path) the table does not
//!   name (a 404 or 405 to come) still needs a valid token when tokens are configured.
//! - Credentials: `api_token` (all rights) and the scoped `api_tokens` (reader, writer,
//!   admin), presented as `Authorization: Bearer`, `ApiKey` (plain or Elasticsearch's
//!   `base64(id:key)`) or `Basic` (the password); compared in constant time on their
//!   SHA-256 digests (the length of a token leaks nothing either) and never logged.
//! - No credentials or an unknown token: 401; a valid token whose role does not grant the
//!   route: 403, each in its API's own error shape (Quickwit JSON, Elasticsearch, Prometheus,
//!   gRPC status).
//! - The internal API takes the cluster secret, never a token. A node with tokens and no
//!   `cluster.cluster_secret` refuses internal calls (a 403 that says why) instead of leaving
//!   them open.
//! - Browser safety: a request that changes something (a write, admin or internal route)
//!   sent by a browser from another origin is refused (403), and so is one sent by a browser
//!   with a "simple" content type (`text/plain`, a form), which a page on another site can
//!   send without asking (415). Clients that are not browsers send neither `Origin` nor
//!   `Sec-Fetch-*` and are not affected. Every response forbids framing and carries a
//!   Content Security Policy that the UI satisfies (no inline script or style).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::handler::Handler;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, Route};
use axum::{Json, Router};
use serde_json::json;
use sha2::{Digest, Sha256};
use shale_config::{NodeConfig, TokenRole};
use tower::{Layer, Service};

use crate::http::{ApiError, AppState};

/// What a route needs from its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Anyone: probes, the UI's login page and static files.
    Public,
    /// Any valid token, whatever its role (the version, who am I).
    Authenticated,
    /// A reader or admin token: search, PromQL, SQL, listings.
    Read,
    /// A writer or admin token: ingest of every kind.
    Write,
    /// An admin token: index, template, delete task and compaction changes.
    Admin,
    /// The cluster secret (node-to-node calls), never a token.
    Internal,
}

impl Access {
    /// Whether a request to such a route changes something (so a browser must not send it
    /// from another site).
    pub fn changes_state(self) -> bool {
        matches!(self, Access::Write | Access::Admin | Access::Internal)
    }

    /// Whether a token of `role` may call such a route.
    pub fn granted_to(self, role: TokenRole) -> bool {
        match self {
            Access::Public | Access::Authenticated => true,
            Access::Read => matches!(role, TokenRole::Reader | TokenRole::Admin),
            Access::Write => matches!(role, TokenRole::Writer | TokenRole::Admin),
            Access::Admin => role == TokenRole::Admin,
            Access::Internal => false,
        }
    }

    /// The name used in messages and the `/api/v1/auth` answer.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Public => "public",
            Access::Authenticated => "authenticated",
            Access::Read => "read",
            Access::Write => "write",
            Access::Admin => "admin",
            Access::Internal => "internal",
        }
    }
}

/// One route of the table: a method, a path pattern (axum's, e.g. `/api/v1/{index_id}/search`)
/// and what it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteAccess {
    /// The HTTP method (HEAD is answered as GET).
    pub method: Method,
    /// The path pattern.
    pub path: String,
    /// What a caller needs.
    pub access: Access,
}

/// Routes with the access each needs: the only way the server adds a route.
pub struct ApiRoutes {
    router: Router<AppState>,
    table: Vec<RouteAccess>,
}

impl Default for ApiRoutes {
    fn default() -> Self {
        ApiRoutes::new()
    }
}

impl ApiRoutes {
    /// No routes.
    pub fn new() -> Self {
        ApiRoutes {
            router: Router::new(),
            table: Vec::new(),
        }
    }

    /// `method path` served by `handler`, for callers with `access`. The same path may be
    /// added again with another method (and another access).
    pub fn route<H, T>(mut self, method: Method, path: &str, access: Access, handler: H) -> Self
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        // Every method the table names is one axum knows: a failure here is a typo in the
        // route list, found by the first test that builds the router.
        let filter = MethodFilter::try_from(method.clone())
            .unwrap_or_else(|_| panic!("no method filter for {method} {path}"));
        self.router = self.router.route(path, axum::routing::on(filter, handler));
        self.table.push(RouteAccess {
            method,
            path: path.to_string(),
            access,
        });
        self
    }

    /// `GET path` (and HEAD).
    pub fn get<H: Handler<T, AppState>, T: 'static>(
        self,
        path: &str,
        access: Access,
        handler: H,
    ) -> Self {
        self.route(Method::GET, path, access, handler)
    }

    /// `POST path`.
    pub fn post<H: Handler<T, AppState>, T: 'static>(
        self,
        path: &str,
        access: Access,
        handler: H,
    ) -> Self {
        self.route(Method::POST, path, access, handler)
    }

    /// `PUT path`.
    pub fn put<H: Handler<T, AppState>, T: 'static>(
        self,
        path: &str,
        access: Access,
        handler: H,
    ) -> Self {
        self.route(Method::PUT, path, access, handler)
    }

    /// `DELETE path`.
    pub fn delete<H: Handler<T, AppState>, T: 'static>(
        self,
        path: &str,
        access: Access,
        handler: H,
    ) -> Self {
        self.route(Method::DELETE, path, access, handler)
    }

    /// `GET` and `POST path`, both served by `handler` (searches that take a body either way).
    pub fn get_post<H: Handler<T, AppState> + Clone, T: 'static>(
        self,
        path: &str,
        access: Access,
        handler: H,
    ) -> Self {
        self.get(path, access, handler.clone())
            .post(path, access, handler)
    }

    /// `POST` and `PUT path`, both served by `handler`.
    pub fn post_put<H: Handler<T, AppState> + Clone, T: 'static>(
        self,
        path: &str,
        access: Access,
        handler: H,
    ) -> Self {
        self.post(path, access, handler.clone())
            .put(path, access, handler)
    }

    /// A gRPC service (every method of it: `POST /{service name}/{method}`).
    pub fn grpc_service<S>(mut self, access: Access, service: S) -> Self
    where
        S: Service<
                axum::http::Request<tonic::body::Body>,
                Error = Infallible,
                Response = axum::http::Response<tonic::body::Body>,
            > + tonic::server::NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        use tower::ServiceExt;
        let path = format!("/{}/{{*method}}", S::NAME);
        let service = service.map_request(|request: Request| request.map(tonic::body::Body::new));
        self.router = self.router.route_service(&path, service);
        self.table.push(RouteAccess {
            method: Method::POST,
            path,
            access,
        });
        self
    }

    /// What answers a path no route matches (it passes the gate too).
    pub fn fallback<H: Handler<T, AppState>, T: 'static>(mut self, handler: H) -> Self {
        self.router = self.router.fallback(handler);
        self
    }

    /// Both sets of routes.
    pub fn merge(mut self, other: ApiRoutes) -> Self {
        self.router = self.router.merge(other.router);
        self.table.extend(other.table);
        self
    }

    /// Wraps these routes (only these) in `layer`, e.g. a body limit.
    pub fn layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<Route> + Clone + Send + Sync + 'static,
        L::Service: Service<Request> + Clone + Send + Sync + 'static,
        <L::Service as Service<Request>>::Response: IntoResponse + 'static,
        <L::Service as Service<Request>>::Error: Into<Infallible> + 'static,
        <L::Service as Service<Request>>::Future: Send + 'static,
    {
        self.router = self.router.layer(layer);
        self
    }

    /// The table: every route with what it needs.
    pub fn table(&self) -> &[RouteAccess] {
        &self.table
    }

    /// The router and its table.
    pub fn into_parts(self) -> (Router<AppState>, Vec<RouteAccess>) {
        (self.router, self.table)
    }
}

/// The tokens a node accepts, as digests.
pub struct Credentials {
    tokens: Vec<([u8; 32], TokenRole)>,
    cluster_secret: Option<String>,
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl Credentials {
    /// `api_token` (admin) and `api_tokens` of `config`, and its cluster secret.
    pub fn new(config: &NodeConfig) -> Self {
        let tokens = config
            .api_token
            .iter()
            .map(|token| (digest(token.as_bytes()), TokenRole::Admin))
            .chain(
                config
                    .api_tokens
                    .iter()
                    .map(|t| (digest(t.token.as_bytes()), t.role)),
            )
            .collect();
        Credentials {
            tokens,
            cluster_secret: config.cluster.cluster_secret.clone(),
        }
    }

    /// Whether any token is configured (else every route but the internal API is open).
    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// The role of `secret`, if it is one of the tokens. Every token is compared (in
    /// constant time) whatever matches, so timing tells nothing.
    pub fn role_of(&self, secret: &[u8]) -> Option<TokenRole> {
        let presented = digest(secret);
        let mut found = None;
        for (token, role) in &self.tokens {
            if crate::internal::same_secret(token, &presented) {
                found = Some(*role);
            }
        }
        found
    }

    /// The role of the credentials in `headers` (`Authorization`), if valid.
    pub fn role_in(&self, headers: &HeaderMap) -> Option<TokenRole> {
        presented_secrets(headers)
            .into_iter()
            .find_map(|secret| self.role_of(&secret))
    }
}

/// The secrets an `Authorization` header may carry: `Bearer <t>`, `ApiKey <t>` or `ApiKey
/// base64(id:t)` (Elasticsearch clients' `api_key`), `Basic base64(user:t)`.
fn presented_secrets(headers: &HeaderMap) -> Vec<Vec<u8>> {
    use base64::Engine;
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return Vec::new();
    };
    let Some((scheme, credentials)) = value.trim().split_once(' ') else {
        return Vec::new();
    };
    let credentials = credentials.trim();
    let decoded_secret = || {
        base64::engine::general_purpose::STANDARD
            .decode(credentials)
            .ok()
            .and_then(|bytes| {
                let colon = bytes.iter().position(|b| *b == b':')?;
                Some(bytes[colon + 1..].to_vec())
            })
    };
    match scheme.to_ascii_lowercase().as_str() {
        "bearer" => vec![credentials.as_bytes().to_vec()],
        "apikey" => std::iter::once(credentials.as_bytes().to_vec())
            .chain(decoded_secret())
            .collect(),
        "basic" => decoded_secret().into_iter().collect(),
        _ => Vec::new(),
    }
}

/// Who called: the role of the token presented (`None` on a node without tokens, where
/// everything but the internal API is open). Handlers read it as an extension.
#[derive(Clone, Copy, Debug)]
pub struct Caller(pub Option<TokenRole>);

/// The gate's state: the credentials and the route table.
pub struct Gate {
    credentials: Arc<Credentials>,
    routes: HashMap<(Method, String), Access>,
    cors_allow_origins: Vec<String>,
}

impl Gate {
    /// A gate for the routes of `table`.
    pub fn new(config: &NodeConfig, credentials: Arc<Credentials>, table: &[RouteAccess]) -> Self {
        Gate {
            credentials,
            routes: table
                .iter()
                .map(|r| ((r.method.clone(), r.path.clone()), r.access))
                .collect(),
            cors_allow_origins: config.rest.cors_allow_origins.clone(),
        }
    }

    /// What `method path` needs: the table's entry, else (a 404 or 405 to come) any token.
    pub fn access(&self, method: &Method, matched_path: Option<&str>) -> Access {
        let method = if method == Method::HEAD {
            Method::GET
        } else {
            method.clone()
        };
        matched_path
            .and_then(|path| self.routes.get(&(method, path.to_string())).copied())
            .unwrap_or(Access::Authenticated)
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        self.cors_allow_origins
            .iter()
            .any(|allowed| allowed == "*" || allowed == origin)
    }
}

/// Why a request was refused.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    /// 401, 403 or 415.
    pub status: StatusCode,
    /// Counted in `shale_requests_refused_total` under this reason.
    pub reason: &'static str,
    /// What to do about it.
    pub message: String,
}

impl Refusal {
    fn new(status: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Refusal {
            status,
            reason,
            message: message.into(),
        }
    }
}

/// Whether a browser sent the request (browsers add `Origin` to every request that changes
/// something, and `Sec-Fetch-*` to every request; other clients send neither).
fn from_browser(headers: &HeaderMap) -> bool {
    headers.contains_key(header::ORIGIN)
        || headers
            .keys()
            .any(|name| name.as_str().starts_with("sec-fetch-"))
}

/// The browser-safety check of a request that changes something.
fn check_browser(gate: &Gate, headers: &HeaderMap) -> Result<(), Refusal> {
    if !from_browser(headers) {
        return Ok(());
    }
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let origin = text(header::ORIGIN);
    let host = text(header::HOST);
    let same_origin = match origin {
        // `scheme://host[:port]` of the page against the `Host` the browser sent here.
        Some(origin) => origin
            .split_once("://")
            .is_some_and(|(_, authority)| Some(authority) == host),
        None => true,
    };
    let cross_site_fetch = matches!(
        text(header::HeaderName::from_static("sec-fetch-site")),
        Some("cross-site" | "same-site")
    );
    let allowed = origin.is_some_and(|origin| gate.origin_allowed(origin));
    if (!same_origin || cross_site_fetch) && !allowed {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "cross_site",
            format!(
                "cross-site request refused: a page of origin `{}` may not change anything on \
                 this node (add it to rest.cors_allow_origins to allow it)",
                origin.unwrap_or("unknown")
            ),
        ));
    }
    let media_type = text(header::CONTENT_TYPE)
        .map(|value| {
            value
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    if matches!(
        media_type.as_str(),
        "" | "text/plain" | "application/x-www-form-urlencoded" | "multipart/form-data"
    ) {
        return Err(Refusal::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "media_type",
            format!(
                "a browser request that changes something must say what it sends \
                 (`Content-Type: application/json`, NDJSON, YAML or protobuf), not `{}`",
                if media_type.is_empty() {
                    "nothing"
                } else {
                    media_type.as_str()
                }
            ),
        ));
    }
    Ok(())
}

/// The gate's decision for a request: the caller's role, or a refusal.
pub fn decide(gate: &Gate, access: Access, headers: &HeaderMap) -> Result<Caller, Refusal> {
    if access.changes_state() {
        check_browser(gate, headers)?;
    }
    let credentials = &gate.credentials;
    match access {
        Access::Public => Ok(Caller(credentials.role_in(headers))),
        Access::Internal => match &credentials.cluster_secret {
            Some(secret) => {
                let presented = headers
                    .get(crate::internal::SECRET_HEADER)
                    .map(|v| v.as_bytes())
                    .unwrap_or_default();
                if crate::internal::same_secret(&digest(presented), &digest(secret.as_bytes())) {
                    Ok(Caller(None))
                } else {
                    Err(Refusal::new(
                        StatusCode::UNAUTHORIZED,
                        "unauthenticated",
                        "internal call without the cluster secret",
                    ))
                }
            }
            None if credentials.enabled() => Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "the internal API is off: this node has API tokens but no \
                 cluster.cluster_secret, and node-to-node calls need one",
            )),
            None => Ok(Caller(None)),
        },
        _ if !credentials.enabled() => Ok(Caller(None)),
        _ => match credentials.role_in(headers) {
            None => Err(Refusal::new(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "missing or invalid API token: send `Authorization: Bearer <token>`",
            )),
            Some(role) if access.granted_to(role) => Ok(Caller(Some(role))),
            Some(role) => Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "a {} token may not do this: it needs {} rights",
                    role.as_str(),
                    match access {
                        Access::Read => "read (reader or admin)",
                        Access::Write => "write (writer or admin)",
                        _ => "admin",
                    }
                ),
            )),
        },
    }
}

/// The refusal in the error shape of the API the request was for.
fn refusal_response(path: &str, headers: &HeaderMap, refusal: Refusal) -> Response {
    let grpc = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    let mut response = if grpc {
        let status = match refusal.status {
            StatusCode::UNAUTHORIZED => tonic::Status::unauthenticated(refusal.message),
            StatusCode::FORBIDDEN => tonic::Status::permission_denied(refusal.message),
            _ => tonic::Status::invalid_argument(refusal.message),
        };
        return status.into_http::<axum::body::Body>();
    } else if path.starts_with(crate::elastic::ELASTIC_PREFIX) {
        crate::elastic::EsError::new(refusal.status, "security_exception", refusal.message)
            .into_response()
    } else if path.starts_with("/prometheus/") {
        let error_type = match refusal.status {
            StatusCode::UNAUTHORIZED => "unauthorized",
            StatusCode::FORBIDDEN => "forbidden",
            _ => "bad_data",
        };
        (
            refusal.status,
            Json(json!({"status": "error", "errorType": error_type, "error": refusal.message})),
        )
            .into_response()
    } else {
        ApiError::new(refusal.status, refusal.message).into_response()
    };
    if response.status() == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

/// The Content Security Policy of every response: the UI loads only its own files and calls
/// only this node; nothing may frame it.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The middleware around every route: decides with [`decide`], counts refusals, adds the
/// browser-safety headers to every answer.
pub async fn gate(State(gate): State<Arc<Gate>>, mut request: Request, next: Next) -> Response {
    let matched = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string());
    let access = gate.access(request.method(), matched.as_deref());
    let mut response = match decide(&gate, access, request.headers()) {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(refusal) => {
            crate::metrics::count_refusal(refusal.reason);
            refusal_response(request.uri().path(), request.headers(), refusal)
        }
    };
    let headers = response.headers_mut();
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// Puts `routes` behind the gate: the one place a router of the node is assembled into a
/// service.
pub fn guard(routes: ApiRoutes, state: AppState) -> Router {
    let (router, table) = routes.into_parts();
    let gate = Arc::new(Gate::new(
        &state.node.config,
        state.credentials.clone(),
        &table,
    ));
    router
        .layer(axum::middleware::from_fn_with_state(gate, self::gate))
        .with_state(state)
}

/// `GET /api/v1/auth`: the caller's role and what it may do (the UI shows it after login).
pub async fn whoami(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Json<serde_json::Value> {
    let role = match (state.credentials.enabled(), caller.0) {
        (false, _) => None,
        (true, role) => role,
    };
    let may = |access: Access| role.is_none_or(|role| access.granted_to(role));
    Json(json!({
        "auth_enabled": state.credentials.enabled(),
        "role": role.map(TokenRole::as_str),
        "may": {
            "read": may(Access::Read),
            "write": may(Access::Write),
            "admin": may(Access::Admin),
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shale_config::ApiToken;

    fn gate(tokens: &[(&str, TokenRole)], secret: Option<&str>) -> Gate {
        let mut config = NodeConfig {
            api_tokens: tokens
                .iter()
                .map(|(token, role)| ApiToken {
                    token: token.to_string(),
                    role: *role,
                })
                .collect(),
            ..NodeConfig::default()
        };
        config.cluster.cluster_secret = secret.map(str::to_string);
        config.rest.cors_allow_origins = vec!["https://allowed.example".to_string()];
        Gate::new(&config, Arc::new(Credentials::new(&config)), &[])
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn each_role_gets_what_it_is_granted_and_nothing_else() {
        let gate = gate(
            &[
                ("reader-token", TokenRole::Reader),
                ("writer-token", TokenRole::Writer),
                ("admin-token1", TokenRole::Admin),
            ],
            Some("cluster-secret"),
        );
        let bearer = |t: &str| headers(&[("authorization", &format!("Bearer {t}"))]);
        let status = |access, h: &HeaderMap| decide(&gate, access, h).err().map(|r| r.status);
        for access in [
            Access::Read,
            Access::Write,
            Access::Admin,
            Access::Authenticated,
        ] {
            assert_eq!(
                status(access, &HeaderMap::new()),
                Some(StatusCode::UNAUTHORIZED)
            );
            assert_eq!(
                status(access, &bearer("wrong-token")),
                Some(StatusCode::UNAUTHORIZED)
            );
            assert_eq!(status(access, &bearer("admin-token1")), None);
        }
        assert_eq!(status(Access::Read, &bearer("reader-token")), None);
        assert_eq!(
            status(Access::Write, &bearer("reader-token")),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(status(Access::Write, &bearer("writer-token")), None);
        assert_eq!(
            status(Access::Read, &bearer("writer-token")),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            status(Access::Admin, &bearer("writer-token")),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(status(Access::Public, &HeaderMap::new()), None);
        // The internal API takes the secret, never a token.
        assert_eq!(
            status(Access::Internal, &bearer("admin-token1")),
            Some(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(
            status(
                Access::Internal,
                &headers(&[(crate::internal::SECRET_HEADER, "cluster-secret")])
            ),
            None
        );
    }

    #[test]
    fn tokens_without_a_cluster_secret_close_the_internal_api() {
        let with_tokens = gate(&[("admin-token1", TokenRole::Admin)], None);
        let refusal = decide(&with_tokens, Access::Internal, &HeaderMap::new()).unwrap_err();
        assert_eq!(refusal.status, StatusCode::FORBIDDEN);
        assert!(refusal.message.contains("cluster_secret"), "{refusal:?}");
        let open = gate(&[], None);
        assert!(decide(&open, Access::Internal, &HeaderMap::new()).is_ok());
        assert!(decide(&open, Access::Admin, &HeaderMap::new()).is_ok());
    }

    #[test]
    fn elasticsearch_api_keys_and_basic_passwords_are_tokens() {
        use base64::Engine;
        let gate = gate(&[("reader-token", TokenRole::Reader)], None);
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        for value in [
            "Bearer reader-token".to_string(),
            "ApiKey reader-token".to_string(),
            format!("ApiKey {}", b64("id:reader-token")),
            format!("Basic {}", b64("elastic:reader-token")),
        ] {
            let h = headers(&[("authorization", &value)]);
            assert!(decide(&gate, Access::Read, &h).is_ok(), "{value}");
        }
        let h = headers(&[("authorization", &format!("Basic {}", b64("reader-token")))]);
        assert!(decide(&gate, Access::Read, &h).is_err());
    }

    #[test]
    fn browsers_may_not_change_anything_from_another_site() {
        let open = gate(&[], None);
        let check = |pairs: &[(&'static str, &str)]| {
            decide(&open, Access::Admin, &headers(pairs))
                .err()
                .map(|r| r.status)
        };
        let json = ("content-type", "application/json");
        // Not a browser: curl, SDKs.
        assert_eq!(check(&[]), None);
        assert_eq!(check(&[("content-type", "text/plain")]), None);
        // A page of another site, whatever it sends.
        assert_eq!(
            check(&[
                ("origin", "https://evil.example"),
                ("host", "node:7280"),
                json
            ]),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            check(&[("sec-fetch-site", "cross-site"), json]),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            check(&[("origin", "null"), json]),
            Some(StatusCode::FORBIDDEN)
        );
        // The node's own page, with JSON: fine; with a simple content type: 415.
        let own = [
            ("origin", "http://node:7280"),
            ("host", "node:7280"),
            ("sec-fetch-site", "same-origin"),
        ];
        assert_eq!(check(&[own[0], own[1], own[2], json]), None);
        assert_eq!(
            check(&[own[0], own[1], own[2], ("content-type", "text/plain")]),
            Some(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        );
        // An allowed origin may, with JSON.
        assert_eq!(
            check(&[
                ("origin", "https://allowed.example"),
                ("host", "node:7280"),
                ("sec-fetch-site", "cross-site"),
                json
            ]),
            None
        );
        // Reads are not checked (CORS keeps their answers from other sites).
        let read = decide(
            &open,
            Access::Read,
            &headers(&[("origin", "https://evil.example"), ("host", "node:7280")]),
        );
        assert!(read.is_ok());
    }
}
