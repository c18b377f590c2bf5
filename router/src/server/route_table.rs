//! Operator routes as a table: each route's path and method written once, for the router
//! that serves them and for the test that holds `docs/openapi.json` to them
//! (`server::openapi`).

use axum::handler::Handler;
use axum::http::Method;
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;

/// One operator route: its path, its method and what answers it there.
pub(crate) type AdminRoute<S> = (&'static str, Method, MethodRouter<S>);

/// `handler` answering `method` on `path`.
#[expect(
    clippy::expect_used,
    reason = "cannot fail: the admin table names GET, POST and DELETE only, standard methods"
)]
pub(crate) fn admin_route<S, H, T>(path: &'static str, method: Method, handler: H) -> AdminRoute<S>
where
    S: Clone + Send + Sync + 'static,
    H: Handler<T, S>,
    T: 'static,
{
    let filter = MethodFilter::try_from(method.clone()).expect("a standard method");
    (path, method, on(filter, handler))
}

/// A router of `routes`.
pub(crate) fn admin_router<S>(routes: impl IntoIterator<Item = AdminRoute<S>>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    routes
        .into_iter()
        .fold(Router::new(), |r, (path, _, handler)| {
            r.route(path, handler)
        })
}
