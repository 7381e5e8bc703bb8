//! Which connections a listener serves, and over which protocol.
//!
//! At most [`Shares::total`] connections in all and [`Shares::per_source`] from one source
//! address; of those, at most [`Shares::http2_total`] over HTTP/2 in all and
//! [`Shares::http2_per_source`] from one source. What happens at a limit:
//!
//! - **A source at its share** (one pod holding idle or silent sockets): a new connection
//!   from it is refused at once, which costs the server an `accept` and a `close`. Other
//!   sources are never touched. (A client that keeps its share of connections idle and opens
//!   more has no need of them.)
//! - **A full listener** (many sources): the new connection takes the place of a connection
//!   with no request in progress (an unfinished handshake counts) of the source holding the
//!   most connections, the oldest of its; a source's only connection gives way last. When
//!   every connection has a request in progress, the new one is refused.
//! - **HTTP/2** is the same, among the HTTP/2 connections, with one difference: a connection
//!   that gets no HTTP/2 share is not refused but offered HTTP/1.1 only, which costs less (a
//!   client that offers nothing but HTTP/2 then fails its handshake).
//!
//! So what one source can hold is its share, and what many sources can hold only lasts while
//! they keep requests in progress, which the request timeouts bound. Pure bookkeeping: no I/O,
//! no clock, no async; the caller closes the connections named as evicted.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use crate::activity::{Activity, Limit};

/// How many connections may be open at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shares {
    /// Connections in all.
    pub total: usize,
    /// Connections from one source address.
    pub per_source: usize,
    /// HTTP/2 connections in all.
    pub http2_total: usize,
    /// HTTP/2 connections from one source address.
    pub http2_per_source: usize,
}

/// A connection's number in the table, in the order they came (lower is older).
pub type ConnectionId = u64;

/// What became of a new connection.
#[derive(Debug)]
pub enum Admission {
    /// Served; `evicted` (if any) must be closed to make room.
    Admitted {
        /// Its number.
        id: ConnectionId,
        /// The connection it replaces, and why.
        evicted: Option<(Arc<Activity>, Limit)>,
    },
    /// Not served: close it.
    Refused(Limit),
}

/// Whether a connection may speak HTTP/2.
#[derive(Debug)]
pub enum Http2 {
    /// Yes; `evicted` (if any) must be closed to make room.
    Granted {
        /// The HTTP/2 connection it replaces, and why.
        evicted: Option<(Arc<Activity>, Limit)>,
    },
    /// No: offer it HTTP/1.1 only.
    Declined(Limit),
}

#[derive(Debug)]
struct Entry {
    activity: Arc<Activity>,
    http2: bool,
}

#[derive(Debug, Default, Clone, Copy)]
struct Held {
    connections: usize,
    http2: usize,
}

/// The connections a listener serves now.
#[derive(Debug)]
pub struct ConnectionTable {
    shares: Shares,
    next: ConnectionId,
    entries: BTreeMap<ConnectionId, Entry>,
    sources: HashMap<IpAddr, Held>,
    http2: usize,
}

impl ConnectionTable {
    /// An empty table with these shares.
    pub fn new(shares: Shares) -> Self {
        Self {
            shares,
            next: 0,
            entries: BTreeMap::new(),
            sources: HashMap::new(),
            http2: 0,
        }
    }

    /// Connections open now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Connections open now from `source`.
    pub fn from_source(&self, source: IpAddr) -> usize {
        self.sources.get(&source).map_or(0, |h| h.connections)
    }

    /// HTTP/2 connections open now.
    pub fn http2_len(&self) -> usize {
        self.http2
    }

    /// A new connection, described by `activity`.
    pub fn admit(&mut self, activity: Arc<Activity>) -> Admission {
        let source = activity.source();
        let evicted = if self.from_source(source) >= self.shares.per_source {
            return Admission::Refused(Limit::SourceLimit);
        } else if self.entries.len() >= self.shares.total {
            match self.victim(|e| e.activity.is_unoccupied(), |h| h.connections) {
                Some(victim) => self.remove(victim).map(|a| (a, Limit::Capacity)),
                None => return Admission::Refused(Limit::Capacity),
            }
        } else {
            None
        };
        let id = self.next;
        self.next += 1;
        self.sources.entry(source).or_default().connections += 1;
        self.entries.insert(
            id,
            Entry {
                activity,
                http2: false,
            },
        );
        Admission::Admitted { id, evicted }
    }

    /// Whether connection `id`, whose client offers HTTP/2, may speak it.
    pub fn want_http2(&mut self, id: ConnectionId) -> Http2 {
        let Some(source) = self.entries.get(&id).map(|e| e.activity.source()) else {
            // Evicted meanwhile: it is closing anyway.
            return Http2::Declined(Limit::Capacity);
        };
        let held = self.sources.get(&source).map_or(0, |h| h.http2);
        let evicted = if held >= self.shares.http2_per_source {
            return Http2::Declined(Limit::SourceLimit);
        } else if self.http2 >= self.shares.http2_total {
            match self.victim(|e| e.http2 && e.activity.is_idle(), |h| h.http2) {
                Some(victim) => self.remove(victim).map(|a| (a, Limit::Capacity)),
                None => return Http2::Declined(Limit::Capacity),
            }
        } else {
            None
        };
        if let Some(entry) = self.entries.get_mut(&id) {
            entry.http2 = true;
            self.http2 += 1;
            self.sources.entry(source).or_default().http2 += 1;
        }
        Http2::Granted { evicted }
    }

    /// Connection `id` has closed (nothing happens if it was evicted before).
    pub fn closed(&mut self, id: ConnectionId) {
        self.remove(id);
    }

    /// Takes `id` out of the table; its activity, if it was there.
    fn remove(&mut self, id: ConnectionId) -> Option<Arc<Activity>> {
        let entry = self.entries.remove(&id)?;
        let source = entry.activity.source();
        if let Some(held) = self.sources.get_mut(&source) {
            held.connections = held.connections.saturating_sub(1);
            if entry.http2 {
                held.http2 = held.http2.saturating_sub(1);
            }
            if held.connections == 0 {
                self.sources.remove(&source);
            }
        }
        if entry.http2 {
            self.http2 = self.http2.saturating_sub(1);
        }
        Some(entry.activity)
    }

    /// The `eligible` connection of the source holding the most (`count` of its [`Held`]),
    /// the oldest of its.
    fn victim(
        &self,
        eligible: impl Fn(&Entry) -> bool,
        count: impl Fn(&Held) -> usize,
    ) -> Option<ConnectionId> {
        let mut best: Option<(usize, ConnectionId)> = None;
        // Ascending ids: the first eligible connection of a source is its oldest.
        for (id, entry) in &self.entries {
            if !eligible(entry) {
                continue;
            }
            let held = self.sources.get(&entry.activity.source()).map_or(0, &count);
            if best.is_none_or(|(most, _)| held > most) {
                best = Some((held, *id));
            }
        }
        best.map(|(_, id)| id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHARES: Shares = Shares {
        total: 6,
        per_source: 3,
        http2_total: 3,
        http2_per_source: 2,
    };

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn admit(t: &mut ConnectionTable, source: u8) -> (Admission, Arc<Activity>) {
        let a = Arc::new(Activity::new(ip(source)));
        (t.admit(a.clone()), a)
    }

    fn id(admission: &Admission) -> ConnectionId {
        match admission {
            Admission::Admitted { id, .. } => *id,
            Admission::Refused(why) => panic!("refused: {why:?}"),
        }
    }

    fn evicted(admission: &Admission) -> Option<(IpAddr, Limit)> {
        match admission {
            Admission::Admitted { evicted, .. } => {
                evicted.as_ref().map(|(a, why)| (a.source(), *why))
            }
            Admission::Refused(why) => panic!("refused: {why:?}"),
        }
    }

    #[test]
    fn a_source_at_its_share_is_refused_and_others_are_not_touched() {
        let mut t = ConnectionTable::new(SHARES);
        let conns: Vec<_> = (0..3).map(|_| admit(&mut t, 1)).collect();
        let (fourth, _) = admit(&mut t, 1);
        assert!(matches!(fourth, Admission::Refused(Limit::SourceLimit)));
        // Idle or not, its connections stay; the new one is refused.
        conns[1].1.ready();
        let (fifth, _) = admit(&mut t, 1);
        assert!(matches!(fifth, Admission::Refused(Limit::SourceLimit)));
        // Another source is not affected.
        let (other, _) = admit(&mut t, 2);
        assert_eq!(evicted(&other), None);
        assert_eq!((t.from_source(ip(1)), t.from_source(ip(2))), (3, 1));
        // Once one closes, the source may open another.
        t.closed(id(&conns[0].0));
        let (sixth, _) = admit(&mut t, 1);
        assert_eq!(evicted(&sixth), None);
    }

    #[test]
    fn the_webhook_takes_an_api_servers_cold_burst_from_one_address() {
        // A fresh API server dials one connection per review waiting; more than 50 were seen
        // at once in a 1,000-pod burst (each then carries a request).
        let mut t = ConnectionTable::new(crate::Limits::webhook().shares);
        let mut requests = Vec::new();
        for n in 0..100 {
            let (a, activity) = admit(&mut t, 1);
            assert!(
                matches!(a, Admission::Admitted { evicted: None, .. }),
                "connection {n}: {a:?}"
            );
            activity.ready();
            requests.push(activity.begin());
        }
        // And another address is still served.
        let (other, _) = admit(&mut t, 2);
        assert_eq!(evicted(&other), None);
    }

    #[test]
    fn a_full_listener_takes_from_the_source_holding_the_most() {
        let mut t = ConnectionTable::new(SHARES);
        let legit = admit(&mut t, 9);
        legit.1.ready();
        for attacker in [1, 1, 1, 2, 2] {
            let (a, _) = admit(&mut t, attacker);
            assert_eq!(evicted(&a), None);
        }
        assert_eq!(t.len(), 6);
        // Full: a new source's connection takes the oldest of source 1's, in its handshake.
        let (new, _) = admit(&mut t, 3);
        assert_eq!(evicted(&new), Some((ip(1), Limit::Capacity)));
        // Now 1 and 2 hold two each: the oldest of those goes (source 1's second).
        let (again, _) = admit(&mut t, 4);
        assert_eq!(evicted(&again), Some((ip(1), Limit::Capacity)));
        assert_eq!(t.from_source(ip(9)), 1, "the legit connection stays");
        assert_eq!(t.len(), 6);
    }

    #[test]
    fn a_full_listener_of_requests_in_progress_refuses() {
        let mut t = ConnectionTable::new(SHARES);
        let mut guards = Vec::new();
        for source in 1..=6 {
            let (_, a) = admit(&mut t, source);
            a.ready();
            guards.push(a.begin());
        }
        let (new, _) = admit(&mut t, 7);
        assert!(matches!(new, Admission::Refused(Limit::Capacity)));
        guards.pop();
        let (new, _) = admit(&mut t, 7);
        assert_eq!(evicted(&new), Some((ip(6), Limit::Capacity)));
    }

    #[test]
    fn http2_shares_decline_to_http1_and_take_idle_places() {
        let mut t = ConnectionTable::new(SHARES);
        let (a, aa) = admit(&mut t, 1);
        let (b, bb) = admit(&mut t, 1);
        let (c, cc) = admit(&mut t, 1);
        for x in [&aa, &bb] {
            x.ready();
        }
        let _busy = aa.begin();
        let granted = |h: Http2| matches!(h, Http2::Granted { evicted: None });
        assert!(granted(t.want_http2(id(&a))));
        assert!(granted(t.want_http2(id(&b))));
        // Source 1 has its two: HTTP/1.1 for the third, even though b is idle.
        assert!(matches!(
            t.want_http2(id(&c)),
            Http2::Declined(Limit::SourceLimit)
        ));
        t.closed(id(&b));
        assert!(granted(t.want_http2(id(&c))));
        assert_eq!(t.http2_len(), 2);
        // Source 2 takes the last HTTP/2 place; source 3 finds none idle: HTTP/1.1.
        let (d, dd) = admit(&mut t, 2);
        dd.ready();
        let _busy_d = dd.begin();
        assert!(granted(t.want_http2(id(&d))));
        let (e, _) = admit(&mut t, 3);
        // c is still in its handshake, not idle; a and d are busy.
        assert!(matches!(
            t.want_http2(id(&e)),
            Http2::Declined(Limit::Capacity)
        ));
        // Once c is idle, it gives way.
        cc.ready();
        match t.want_http2(id(&e)) {
            Http2::Granted {
                evicted: Some((victim, Limit::Capacity)),
            } => assert!(Arc::ptr_eq(&victim, &cc)),
            other => panic!("{other:?}"),
        }
        assert_eq!(t.http2_len(), 3);
        drop(bb);
    }

    #[test]
    fn closing_frees_places_and_forgets_sources() {
        let mut t = ConnectionTable::new(SHARES);
        let (a, _) = admit(&mut t, 1);
        let _ = t.want_http2(id(&a));
        t.closed(id(&a));
        t.closed(id(&a));
        assert!(t.is_empty());
        assert_eq!((t.http2_len(), t.from_source(ip(1))), (0, 0));
        assert!(t.sources.is_empty());
    }
}
