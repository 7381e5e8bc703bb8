//! Writes that stall fail: a client that stops reading its answer loses its connection after
//! a while, and the answer (with what it holds of the memory budget) is let go, instead of
//! sitting in the connection's buffers for as long as the client likes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// A TCP stream whose writes fail once the peer has taken nothing for `limit`: a client that
/// stops reading its answer then loses its connection, and the answer (and its share of the
/// memory budget) is let go.
#[derive(Debug)]
pub struct StallLimit<IO> {
    stream: IO,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<IO> StallLimit<IO> {
    /// `stream`, whose writes fail after `limit` without progress.
    pub fn new(stream: IO, limit: Duration) -> Self {
        Self {
            stream,
            limit,
            stalled: None,
        }
    }

    /// The stream.
    pub fn get_ref(&self) -> &IO {
        &self.stream
    }

    /// Called when a write is pending: an error once it has been pending for `limit`.
    fn stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let limit = self.limit;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {limit:?}"),
            )),
            Poll::Pending => Poll::Pending,
        }
    }

    fn written<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match poll {
            Poll::Pending => self.stall(cx).map(Err),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for StallLimit<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for StallLimit<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.written(cx, poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.written(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_flush(cx);
        this.written(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_shutdown(cx);
        this.written(cx, poll)
    }
}
