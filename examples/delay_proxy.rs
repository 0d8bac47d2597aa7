//! A TCP proxy that delays every chunk by a fixed time in each direction:
//! a stand-in for the network between Warden servers and PostgreSQL where
//! the kernel has no `netem`.
//!
//! ```text
//! cargo run --release -p warden-postgres --example delay_proxy -- LISTEN UPSTREAM DELAY_MS
//! ```
//!
//! Each direction of each connection is a timed queue: a reader stamps
//! every chunk it reads with `now + delay` and queues it; a writer sends
//! each chunk once its time has come. Chunks are never held behind each
//! other's delays (a pipeline of requests stays a pipeline), so a round
//! trip costs `2 x delay` whatever is in flight. It prints `listening on
//! ADDR` once bound.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, listen, upstream, delay_ms] = args.as_slice() else {
        return Err("usage: delay_proxy LISTEN UPSTREAM DELAY_MS".into());
    };
    let delay = Duration::from_millis(delay_ms.parse()?);
    let listener = TcpListener::bind(listen).await?;
    println!("listening on {}", listener.local_addr()?);
    loop {
        let (client, _) = listener.accept().await?;
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let server = match TcpStream::connect(&upstream).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("delay_proxy: cannot connect to {upstream}: {e}");
                    return;
                }
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::spawn(direction(cr, sw, delay));
            tokio::spawn(direction(sr, cw, delay));
        });
    }
}

/// Copy `from` to `to`, each chunk `delay` after it was read.
async fn direction(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let (queue, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                // `read` never reports more than the buffer holds.
                let chunk = buf.get(..n).unwrap_or(&buf).to_vec();
                if queue.send((Instant::now() + delay, chunk)).is_err() {
                    break;
                }
            }
        }
    }
    drop(queue);
    let _ = writer.await;
}
