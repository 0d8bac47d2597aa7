//! The one middleware every request passes: timeout, panic isolation,
//! latency metrics and a debug log line.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use warden_store::Store;

use crate::error::ApiError;
use crate::state::AppState;

/// A future that turns a panic while polling into an `Err`.
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.0.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(move || inner.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

fn panic_message(p: &(dyn Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("unknown panic")
}

/// Time the request, bound it by the configured timeout, turn a panic into
/// a 500, and count it in the metrics under its route template.
pub(crate) async fn observe<S: Store>(
    State(st): State<AppState<S>>,
    req: Request,
    next: Next,
) -> Response {
    let start = Instant::now();
    let method = req.method().as_str().to_owned();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let timeout = st.config().request_timeout;
    let in_flight = st.metrics().start_request();
    let fut = CatchUnwind(Box::pin(next.run(req)));
    let response = match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(r)) => r,
        Ok(Err(panic)) => ApiError::internal(&format!(
            "handler panicked: {}",
            panic_message(panic.as_ref())
        ))
        .into_response(),
        Err(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "timeout",
            format!("the request took longer than {} ms", timeout.as_millis()),
        )
        .into_response(),
    };
    drop(in_flight);
    let elapsed = start.elapsed();
    let status = response.status().as_u16();
    st.metrics()
        .observe_request(&method, &route, status, elapsed);
    tracing::debug!(
        method = %method,
        route = %route,
        status,
        micros = elapsed.as_micros() as u64,
        "request"
    );
    response
}
