//! A TCP proxy that delays every chunk by a fixed time in each direction:
//! a stand-in for the network between Warden servers and PostgreSQL where
//! the kernel has no `netem`.
//!
//! ```text
//! cargo run --release -p warden-postgres --example delay_proxy -- LISTEN UPSTREAM DELAY_MS
//! ```
//!
//! `DELAY_MS` may be fractional (`0.5`). Each direction of each connection
//! is a timed queue: a reader stamps every chunk it reads with `now +
//! delay` and queues it; a writer sends each chunk once its time has come.
//! Chunks are never held behind each other's delays (a pipeline of
//! requests stays a pipeline), so a round trip costs `2 x delay` whatever
//! is in flight. Readers and writers are threads sleeping with the
//! operating system's timer (tens of microseconds late), not an async
//! runtime's millisecond wheel, which rounds every delay up to the next
//! millisecond and made a "1 ms" hop cost up to 2. It prints `listening on
//! ADDR` once bound.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, listen, upstream, delay_ms] = args.as_slice() else {
        return Err("usage: delay_proxy LISTEN UPSTREAM DELAY_MS".into());
    };
    let delay_ms: f64 = delay_ms.parse()?;
    if !(0.0..=60_000.0).contains(&delay_ms) {
        return Err("DELAY_MS must be between 0 and 60000".into());
    }
    let delay = Duration::from_secs_f64(delay_ms / 1_000.0);
    let listener = TcpListener::bind(listen)?;
    println!("listening on {}", listener.local_addr()?);
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        let upstream = upstream.clone();
        std::thread::spawn(move || {
            let server = match TcpStream::connect(&upstream) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("delay_proxy: cannot connect to {upstream}: {e}");
                    return;
                }
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let pairs = [
                (client.try_clone(), server.try_clone()),
                (server.try_clone(), client.try_clone()),
            ];
            for (from, to) in pairs {
                if let (Ok(from), Ok(to)) = (from, to) {
                    std::thread::spawn(move || direction(from, to, delay));
                }
            }
        });
    }
    Ok(())
}

/// Copy `from` to `to`, each chunk `delay` after it was read.
fn direction(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (queue, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = std::thread::spawn(move || {
        while let Ok((at, chunk)) = due.recv() {
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let chunk = buf.get(..n).unwrap_or(&buf).to_vec();
                if queue.send((Instant::now() + delay, chunk)).is_err() {
                    break;
                }
            }
        }
    }
    drop(queue);
    let _ = writer.join();
}
