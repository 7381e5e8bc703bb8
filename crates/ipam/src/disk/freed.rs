//! A store's memory of when each free address was freed, for the reuse cooldown (tables
//! `freed` and `freed_order` of [`super::db`]).
//!
//! An entry matters only while its address is cooling. So the commits that change the table
//! also forget what is past the cooldown (`Commit::forget_freed_until`, set by ADD) and then
//! the oldest beyond [`MAX_FREED_REMEMBERED`]: on an IPv6 range round robin may never come back
//! to an address, and every pod deletion would otherwise grow the store for good. `freed_order`
//! indexes `freed` by time and has exactly its entries; a store whose index does not match
//! (written before the index existed, or by an ipkeep that does not know it) gets it rebuilt in
//! its next such commit.

use redb::TableDefinition;

use super::db::ip_key;
use crate::store::{Commit, MAX_FREED_REMEMBERED};

/// Free addresses → when they were freed (store clock). Optional within layout 2: a store
/// without it has freed nothing yet, and a reader that ignores it only hands an address out
/// sooner (its entries only ever make an address wait longer).
pub(super) const FREED: TableDefinition<&[u8], u64> = TableDefinition::new("freed");
/// `freed` by time, oldest first; optional like `freed`.
pub(super) const FREED_ORDER: TableDefinition<(u64, &[u8]), ()> =
    TableDefinition::new("freed_order");

/// Applies a commit's `freed` changes to the table and its time index, then forgets what is
/// past the cooldown and the oldest beyond [`MAX_FREED_REMEMBERED`].
pub(super) fn remember(
    freed: &mut redb::Table<&'static [u8], u64>,
    order: &mut redb::Table<(u64, &'static [u8]), ()>,
    commit: &Commit,
) -> Result<(), redb::StorageError> {
    use redb::{ReadableTable, ReadableTableMetadata};
    if order.len()? != freed.len()? {
        // Written before the index existed (or by an ipkeep that does not know it).
        order.retain(|_, ()| false)?;
        let mut entries = Vec::new();
        for entry in freed.range::<&[u8]>(..)? {
            let (key, at) = entry?;
            entries.push((at.value(), key.value().to_vec()));
        }
        for (at, key) in &entries {
            order.insert((*at, key.as_slice()), ())?;
        }
    }
    for (ip, at) in &commit.freed {
        let key = ip_key(*ip);
        let before = freed.remove(&key[..])?.map(|v| v.value());
        if let Some(before) = before {
            order.remove((before, &key[..]))?;
        }
        if let Some(at) = at {
            freed.insert(&key[..], *at)?;
            order.insert((*at, &key[..]), ())?;
        }
    }
    let max = u64::try_from(MAX_FREED_REMEMBERED).unwrap_or(u64::MAX);
    loop {
        let oldest = order
            .first()?
            .map(|(k, _)| (k.value().0, k.value().1.to_vec()));
        let Some((at, key)) = oldest else {
            return Ok(());
        };
        let stale = commit.forget_freed_until.is_some_and(|until| at <= until);
        if !stale && order.len()? <= max {
            return Ok(());
        }
        order.remove((at, key.as_slice()))?;
        // Only the entry this index entry stands for (a stale index entry removes nothing).
        if freed.get(key.as_slice())?.is_some_and(|v| v.value() == at) {
            freed.remove(key.as_slice())?;
        }
    }
}
