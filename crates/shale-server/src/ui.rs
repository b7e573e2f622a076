//! The web UI: a single page (cluster, indexes, split map, compaction, search, metrics) whose
//! files are embedded in the binary and served under `/ui`; it reads everything through the
//! public REST API, so it shows what any client sees.
//!
//! With an `api_token`, the page itself is behind the token too: a browser cannot attach an
//! `Authorization` header to a navigation, so the page also accepts the token from the
//! `shale_api_token` cookie that `/ui/login` sets (SameSite=Strict, read by the page to sign
//! its API calls with `Authorization: Bearer`; the API itself never takes the cookie, so it
//! gives cross-site requests nothing). The login page and the static assets hold no data and
//! are served to anyone.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

use crate::auth::{Access, ApiRoutes};
use crate::http::AppState;

/// The cookie `/ui/login` stores the API token in.
pub const TOKEN_COOKIE: &str = "shale_api_token";

/// One embedded file: its name under `/ui/assets/`, content type and bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

const INDEX_HTML: &[u8] = include_bytes!("../ui/index.html");
const LOGIN_HTML: &[u8] = include_bytes!("../ui/login.html");

const ASSETS: &[Asset] = &[
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../ui/app.js"),
    },
    Asset {
        name: "login.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../ui/login.js"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../ui/style.css"),
    },
    Asset {
        name: "uPlot.iife.min.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../ui/vendor/uPlot.iife.min.js"),
    },
    Asset {
        name: "uPlot.min.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../ui/vendor/uPlot.min.css"),
    },
    Asset {
        name: "favicon.svg",
        content_type: "image/svg+xml",
        bytes: include_bytes!("../ui/favicon.svg"),
    },
];

/// The UI's routes: `/` and `/ui` (the page), `/ui/login`, `/ui/assets/{file}`.
/// They are [`Access::Public`]: `page` checks the token itself (and redirects to the login).
pub fn routes() -> ApiRoutes {
    use Access::Public;
    ApiRoutes::new()
        .get("/", Public, || async { Redirect::to("/ui") })
        .get("/ui", Public, page)
        .get("/ui/login", Public, login)
        .get("/ui/assets/{name}", Public, asset)
        .get("/favicon.ico", Public, favicon)
}

fn html(bytes: &'static [u8]) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        bytes,
    )
        .into_response()
}

/// The value of the token cookie, percent-decoded.
fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == TOKEN_COOKIE)
        .and_then(|(_, value)| {
            percent_encoding::percent_decode_str(value)
                .decode_utf8()
                .ok()
                .map(|v| v.into_owned())
        })
}

/// `GET /ui`: the page, or with an API token and none presented, a redirect to the login.
async fn page(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let credentials = &state.credentials;
    if credentials.enabled() {
        let by_cookie = cookie_token(&headers).and_then(|t| credentials.role_of(t.as_bytes()));
        if by_cookie
            .or_else(|| credentials.role_in(&headers))
            .is_none()
        {
            return Redirect::to("/ui/login").into_response();
        }
    }
    html(INDEX_HTML)
}

/// `GET /ui/login`: asks for the API token.
async fn login() -> Response {
    html(LOGIN_HTML)
}

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|asset| asset.name == name) {
        Some(asset) => (
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(asset.content_type),
                ),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            ],
            asset.bytes,
        )
            .into_response(),
        None => crate::http::ApiError::new(StatusCode::NOT_FOUND, format!("no UI asset `{name}`"))
            .into_response(),
    }
}

async fn favicon() -> Response {
    asset(Path("favicon.svg".to_string())).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_cookie_is_found_among_others_and_decoded() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; shale_api_token=s%3Bcr%20et; b=2"),
        );
        assert_eq!(cookie_token(&headers).as_deref(), Some("s;cr et"));
        headers.insert(header::COOKIE, HeaderValue::from_static("a=1"));
        assert_eq!(cookie_token(&headers), None);
    }

    #[test]
    fn every_page_references_only_embedded_assets() {
        for page in [INDEX_HTML, LOGIN_HTML] {
            let text = String::from_utf8_lossy(page);
            for part in text.split("/ui/assets/").skip(1) {
                let name: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '_')
                    .collect();
                assert!(
                    ASSETS.iter().any(|asset| asset.name == name),
                    "{name} is referenced but not embedded"
                );
            }
        }
    }
}
