//! A TCP proxy for injecting network faults between a service and its database.
//!
//! Process-level faults (see [`super::PgServer::pause`]) cannot express what happens on the
//! network: slow links, partitions that keep sockets open but deliver nothing, and connections
//! that are torn down mid-transaction. Tests point a service at [`TcpProxy::addr`] instead of the
//! database and switch the proxy's [`ProxyMode`] at any time; the mode is shared through a
//! `tokio::sync::watch` channel, so a change applies immediately to every existing connection as
//! well as to new ones.
//!
//! Blackholing *holds* bytes rather than discarding them: the proxy stops reading, so TCP flow
//! control eventually blocks the sender, and anything already in flight is delivered when the
//! partition heals. This is how a real partition behaves for TCP (segments are retransmitted until
//! the path comes back or a timeout fires), so the service's own timeouts are what is under test.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Size of the per-direction forwarding buffer (one "chunk").
const CHUNK: usize = 16 * 1024;

/// How the proxy treats traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyMode {
    /// Forward bytes as they arrive.
    #[default]
    Pass,
    /// Forward every chunk, in both directions, only after this delay (a slow or congested
    /// link). Chunks of one direction stay in order, so the delays add up under sustained
    /// traffic.
    Delay(Duration),
    /// Forward nothing in either direction while keeping connections open, and accept new
    /// connections without connecting them upstream (a network partition). Switching back to
    /// `Pass`/`Delay` resumes delivery of held bytes and connects waiting clients.
    Blackhole,
}

/// A running proxy from [`TcpProxy::addr`] to an upstream address.
///
/// Dropping it stops accepting and closes every proxied connection.
#[derive(Debug)]
pub struct TcpProxy {
    /// Where clients connect (127.0.0.1, ephemeral port).
    addr: SocketAddr,
    /// Where connections are forwarded to.
    upstream: SocketAddr,
    /// Current mode; every connection task watches it so mode changes apply to live traffic.
    mode_tx: watch::Sender<ProxyMode>,
    /// Generation counter bumped by [`TcpProxy::cut_all`]; each connection closes when it sees a
    /// newer generation than the one it started with. Dropping the sender also closes them,
    /// which is how `Drop` tears down connections without tracking them individually.
    cut_tx: watch::Sender<u64>,
    /// Number of client connections currently open, so tests can wait for a service to
    /// (re)connect.
    active: Arc<AtomicUsize>,
    /// The accept loop; aborted on drop so the listening port is released.
    accept_task: JoinHandle<()>,
}

impl TcpProxy {
    /// Listens on 127.0.0.1 (ephemeral port) and forwards every accepted connection to
    /// `upstream`. Must be called from within a tokio runtime (it spawns the accept loop); it
    /// does not block.
    pub fn start(upstream: SocketAddr) -> Result<TcpProxy> {
        let handle = tokio::runtime::Handle::try_current()
            .context("TcpProxy::start must be called inside a tokio runtime")?;
        let std_listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .context("binding proxy listener")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let listener = {
            let _guard = handle.enter();
            TcpListener::from_std(std_listener)?
        };
        let (mode_tx, mode_rx) = watch::channel(ProxyMode::Pass);
        let (cut_tx, cut_rx) = watch::channel(0u64);
        let active = Arc::new(AtomicUsize::new(0));
        let accept_task = handle.spawn(accept_loop(
            listener,
            upstream,
            mode_rx,
            cut_rx,
            Arc::clone(&active),
        ));
        Ok(TcpProxy {
            addr,
            upstream,
            mode_tx,
            cut_tx,
            active,
            accept_task,
        })
    }

    /// The address clients should connect to instead of the upstream.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address traffic is forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Switches the mode for existing and new connections, effective immediately.
    pub fn set_mode(&self, mode: ProxyMode) {
        self.mode_tx.send_replace(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        *self.mode_tx.borrow()
    }

    /// Abruptly closes all currently open connections (both sides get a TCP reset), like a
    /// middlebox or NAT dropping its state. New connections are accepted normally afterwards.
    pub fn cut_all(&self) {
        self.cut_tx.send_modify(|generation| *generation += 1);
    }

    /// Number of client connections currently open through the proxy.
    pub fn active_connections(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        // Stops accepting; the connection tasks end when `cut_tx` is dropped right after this.
        self.accept_task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    mode_rx: watch::Receiver<ProxyMode>,
    cut_rx: watch::Receiver<u64>,
    active: Arc<AtomicUsize>,
) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(e) => {
                // E.g. EMFILE; back off instead of spinning.
                tracing::warn!(error = %e, "testkit proxy accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let mut conn_cut = cut_rx.clone();
        // Only cuts issued from now on concern this connection.
        conn_cut.mark_unchanged();
        let guard = ActiveGuard::new(Arc::clone(&active));
        tokio::spawn(handle_connection(
            client,
            upstream,
            mode_rx.clone(),
            conn_cut,
            guard,
        ));
    }
}

/// Keeps [`TcpProxy::active_connections`] accurate however a connection task ends.
struct ActiveGuard(Arc<AtomicUsize>);

impl ActiveGuard {
    fn new(counter: Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        ActiveGuard(counter)
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How one forwarding direction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PumpEnd {
    /// The source half-closed; the other direction may keep going.
    Eof,
    /// A read/write failed (reset) or the proxy shut down: tear the whole connection down.
    Abort,
}

async fn handle_connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut mode_rx: watch::Receiver<ProxyMode>,
    mut cut_rx: watch::Receiver<u64>,
    _guard: ActiveGuard,
) {
    let _ = client.set_nodelay(true);
    // While blackholed the client is accepted but not connected upstream, as if the SYN to the
    // database were lost.
    let connect = async {
        mode_rx
            .wait_for(|m| *m != ProxyMode::Blackhole)
            .await
            .ok()?;
        TcpStream::connect(upstream).await.ok()
    };
    let mut server = tokio::select! {
        server = connect => match server {
            Some(server) => server,
            None => {
                // Upstream refused or the proxy is shutting down: reset the client.
                let _ = client.set_zero_linger();
                return;
            }
        },
        _ = cut_rx.changed() => {
            let _ = client.set_zero_linger();
            return;
        }
    };
    let _ = server.set_nodelay(true);

    let cut = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let forward = async {
            let to_server = pump(client_read, server_write, mode_rx.clone());
            let to_client = pump(server_read, client_write, mode_rx.clone());
            tokio::pin!(to_server, to_client);
            let (mut server_done, mut client_done) = (false, false);
            while !(server_done && client_done) {
                let end = tokio::select! {
                    end = &mut to_server, if !server_done => { server_done = true; end }
                    end = &mut to_client, if !client_done => { client_done = true; end }
                };
                if end == PumpEnd::Abort {
                    return PumpEnd::Abort;
                }
            }
            PumpEnd::Eof
        };
        tokio::select! {
            end = forward => end == PumpEnd::Abort,
            _ = cut_rx.changed() => true,
        }
    };
    if cut {
        // Zero linger turns the close into an RST, so both peers notice immediately.
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
    }
}

/// Copies `from` -> `to` chunk by chunk, honouring the mode before reading and before writing
/// each chunk.
async fn pump(
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    mut mode_rx: watch::Receiver<ProxyMode>,
) -> PumpEnd {
    let mut buf = vec![0u8; CHUNK];
    loop {
        // Do not even read while partitioned, so the sender sees back-pressure.
        if mode_rx
            .wait_for(|m| *m != ProxyMode::Blackhole)
            .await
            .is_err()
        {
            return PumpEnd::Abort;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) => {
                let _ = to.shutdown().await;
                return PumpEnd::Eof;
            }
            Ok(n) => n,
            Err(_) => return PumpEnd::Abort,
        };
        let mode = *mode_rx.borrow_and_update();
        if let ProxyMode::Delay(delay) = mode {
            tokio::time::sleep(delay).await;
        }
        // A partition that started while this chunk was in flight holds it until it heals.
        if mode_rx
            .wait_for(|m| *m != ProxyMode::Blackhole)
            .await
            .is_err()
        {
            return PumpEnd::Abort;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return PumpEnd::Abort;
        }
    }
}
