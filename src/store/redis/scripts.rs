//! The Lua scripts of the Redis store: every state transition is one of
//! them, run with `EVALSHA` (loaded on first use, and again after a
//! `NOSCRIPT`), atomic as a script is, on the keys of one record only.
//!
//! Every script reads the time from the server (`TIME`), never from the
//! application, and writes expiries with `PEXPIREAT`, so that Redis itself
//! forgets what has expired.
//!
//! The record of `(scope, key)` is a hash at `KEYS[1]`:
//!
//! | field | value |
//! |---|---|
//! | `s`, `k` | the scope and the key, checked by every script |
//! | `fp` | the payload's fingerprint (32 bytes) |
//! | `st` | `in_progress` or `completed` |
//! | `f` | the fence: 1 for a fresh record, +1 at every takeover |
//! | `tok` | the claim token (16 bytes) |
//! | `lease` | while in progress: when the lease runs out (ms) |
//! | `kind`, `body` | once completed: the outcome's kind code and bytes |
//! | `c`, `exp` | when it was claimed, when it expires (ms) |
//! | `w` | `1` while in progress once a duplicate waits on it |
//!
//! The step journal of the record's operation is a hash at `KEYS[2]`, with
//! the fields `<seq>:n` (name), `<seq>:fp`, `<seq>:st` (`started`,
//! `completed`, `rerun_allowed`), `<seq>:tok`, `<seq>:out` (the output),
//! `<seq>:u` (last written) and `<seq>:e` (expires) for each step. The
//! hash expires with its latest entry.
//!
//! A completion or release that a duplicate waits for (`w`) publishes on
//! the record's channel (`ARGV` names it and the command: `SPUBLISH` on a
//! cluster, whose shard channels live in the record's slot, `PUBLISH` on a
//! single Redis) the scope and key, as `<len(scope)>:<scope><key>`.

use std::sync::LazyLock;

use redis::{Cmd, Script, ToRedisArgs};

/// What every script begins with: the server's time in milliseconds, and
/// integers written exactly (Lua's numbers are doubles, exact below 2^53;
/// `tostring` would print large ones in exponent form).
const PRELUDE: &str = "\
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function int(x) return string.format('%.0f', x) end
local rec = KEYS[1]
";

/// A script: its source, for `SCRIPT LOAD`, and its SHA-1, for `EVALSHA`.
pub(super) struct Lua {
    code: String,
    hash: String,
}

fn script(body: &str) -> Lua {
    let code = format!("{PRELUDE}{body}");
    let hash = Script::new(&code).get_hash().to_owned();
    Lua { code, hash }
}

impl Lua {
    /// A call of the script on `key` (the record, which routes it).
    pub(super) fn on(&self, key: &str) -> Invocation<'_> {
        Invocation {
            lua: self,
            keys: vec![key.as_bytes().to_vec()],
            args: Vec::new(),
        }
    }

    /// `SCRIPT LOAD` of the script (on every primary of a cluster).
    pub(super) fn load(&self) -> Cmd {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(&self.code);
        load
    }
}

/// One call of a script: its keys and arguments, as bytes.
pub(super) struct Invocation<'a> {
    pub(super) lua: &'a Lua,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Invocation<'_> {
    /// Another key, in the record's slot.
    pub(super) fn key(mut self, key: &str) -> Self {
        self.keys.push(key.as_bytes().to_vec());
        self
    }

    pub(super) fn arg<T: ToRedisArgs>(mut self, arg: T) -> Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// `EVALSHA <hash> <keys> <args>`.
    pub(super) fn evalsha(&self) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.lua.hash)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }
}

/// The scripts, hashed once.
pub(super) struct Scripts {
    pub claim: Lua,
    pub peek: Lua,
    pub look: Lua,
    pub renew: Lua,
    pub complete: Lua,
    pub release: Lua,
    pub forget: Lua,
    pub begin_step: Lua,
    pub abandon_step: Lua,
    pub complete_step: Lua,
    pub resolve_step: Lua,
    pub keep_steps: Lua,
}

pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: script(&format!("{KEEP_JOURNAL}{CLAIM}")),
    peek: script(PEEK),
    look: script(LOOK),
    renew: script(RENEW),
    complete: script(COMPLETE),
    release: script(RELEASE),
    forget: script(FORGET),
    begin_step: script(BEGIN_STEP),
    abandon_step: script(ABANDON_STEP),
    complete_step: script(COMPLETE_STEP),
    resolve_step: script(RESOLVE_STEP),
    keep_steps: script(&format!("{KEEP_JOURNAL}{KEEP_STEPS}")),
});

/// A function `keep(jrn, until_)`: keeps every live entry of the journal
/// `jrn` until at least `until_` (ms), and the journal key with them.
const KEEP_JOURNAL: &str = r#"
local function keep_journal(jrn, until_)
  local fields = redis.call('HGETALL', jrn)
  local kept = false
  for i = 1, #fields, 2 do
    local name = fields[i]
    if string.sub(name, -2) == ':e' then
      local e = tonumber(fields[i + 1])
      if e > now and e < until_ then
        redis.call('HSET', jrn, name, int(until_))
        kept = true
      end
    end
  end
  if kept and redis.call('PEXPIRETIME', jrn) < until_ then
    redis.call('PEXPIREAT', jrn, int(until_))
  end
end
"#;

/// Keeps every live entry of the journal `KEYS[2]` until at least
/// `ARGV[1]` ms from now, and the journal key with them. Answers 1.
const KEEP_STEPS: &str = r#"
keep_journal(KEYS[2], now + tonumber(ARGV[1]))
return 1
"#;

/// Answers `{'claimed', fence}` when this request holds the key now (a
/// fresh record, fence 1, also in place of an expired one; a takeover of
/// a lapsed lease with the same fingerprint, fence + 1; or this very
/// request sent again), else
/// `{'found', now, <the record's fields as HGETALL lists them>}` for
/// `record::decide`.
///
/// A claim keeps the live entries of the operation's journal (`KEYS[2]`)
/// until the record expires: an attempt that takes the key over, or
/// claims it while its journal is live, joins that operation, and its
/// record must not outlive the steps it would otherwise run again.
///
/// `ARGV`: scope, key, fingerprint, token, lease (ms), ttl (ms).
const CLAIM: &str = r#"
local h = redis.call('HMGET', rec, 'st', 'f', 'tok', 'lease', 'exp', 'fp', 's', 'k')
local fence = 0
local free = false
if not h[1] then
  free = true
else
  if h[7] ~= ARGV[1] or h[8] ~= ARGV[2] then
    return redis.error_reply('ERR idem: the record at ' .. rec .. ' belongs to another scope and key')
  end
  if h[1] == 'in_progress' and h[3] == ARGV[4] then
    return {'claimed', tonumber(h[2])}
  end
  if tonumber(h[5]) <= now then
    -- Expired, as Redis is about to say: a fresh record, fence 1.
    free = true
  elseif h[1] == 'in_progress' and h[6] == ARGV[3] and h[4] and tonumber(h[4]) <= now then
    -- A lapsed lease, same payload: taken over.
    fence = tonumber(h[2])
    free = true
  end
end
if not free then
  return {'found', int(now), redis.call('HGETALL', rec)}
end
local lease_until = now + tonumber(ARGV[5])
local exp = math.max(now + tonumber(ARGV[6]), lease_until)
redis.call('DEL', rec)
redis.call('HSET', rec, 's', ARGV[1], 'k', ARGV[2], 'fp', ARGV[3], 'st', 'in_progress',
  'f', int(fence + 1), 'tok', ARGV[4], 'lease', int(lease_until), 'c', int(now), 'exp', int(exp))
redis.call('PEXPIREAT', rec, int(exp))
keep_journal(KEYS[2], exp)
return {'claimed', fence + 1}
"#;

/// Answers `{now, <the record's fields>}` (none when there is no record),
/// writing nothing.
const PEEK: &str = r#"
return {int(now), redis.call('HGETALL', rec)}
"#;

/// `PEEK` for a duplicate about to wait: marks a record in progress `w`,
/// so that its completion or release publishes.
const LOOK: &str = r#"
if redis.call('HGET', rec, 'st') == 'in_progress' then
  redis.call('HSET', rec, 'w', '1')
end
return {int(now), redis.call('HGETALL', rec)}
"#;

/// Extends the lease of the claim `ARGV[1]` by `ARGV[2]` ms from now (the
/// record's expiry with it). Answers 1, or 0 when the record is not in
/// progress under that token.
const RENEW: &str = r#"
local h = redis.call('HMGET', rec, 'st', 'tok', 'exp')
if h[1] ~= 'in_progress' or h[2] ~= ARGV[1] then
  return 0
end
local lease_until = now + tonumber(ARGV[2])
local exp = math.max(tonumber(h[3]), lease_until)
redis.call('HSET', rec, 'lease', int(lease_until), 'exp', int(exp))
redis.call('PEXPIREAT', rec, int(exp))
return 1
"#;

/// Publishes the record's scope and key on its channel if a duplicate
/// waits (`waited`). `ARGV[1]` and `ARGV[2]` of the caller name the
/// command and the channel.
macro_rules! notify {
    () => {
        r#"
local function notify(waited, scope, key)
  if waited == '1' and scope then
    redis.call(ARGV[1], ARGV[2], string.len(scope) .. ':' .. scope .. key)
  end
end
"#
    };
}

/// Stores the outcome of the claim `ARGV[3]` (kind `ARGV[4]`, bytes
/// `ARGV[5]`), kept `ARGV[6]` ms from now. Answers 1; also 1 when the
/// record is already completed by that claim with this very outcome (a
/// completion sent again); else 0.
const COMPLETE: &str = concat!(
    notify!(),
    r#"
local h = redis.call('HMGET', rec, 'st', 'tok', 'kind', 'body', 'w', 's', 'k')
if h[2] ~= ARGV[3] then
  return 0
end
if h[1] == 'completed' then
  if h[3] == ARGV[4] and h[4] == ARGV[5] then return 1 end
  return 0
end
if h[1] ~= 'in_progress' then
  return 0
end
local exp = now + tonumber(ARGV[6])
redis.call('HSET', rec, 'st', 'completed', 'kind', ARGV[4], 'body', ARGV[5], 'exp', int(exp))
redis.call('HDEL', rec, 'lease', 'w')
redis.call('PEXPIREAT', rec, int(exp))
notify(h[5], h[6], h[7])
return 1
"#
);

/// Deletes the record in progress under the claim `ARGV[3]`. Answers 1,
/// or 0 (nothing deleted) when the record is not in progress under it.
const RELEASE: &str = concat!(
    notify!(),
    r#"
local h = redis.call('HMGET', rec, 'st', 'tok', 'w', 's', 'k')
if h[1] ~= 'in_progress' or h[2] ~= ARGV[3] then
  return 0
end
redis.call('DEL', rec)
notify(h[3], h[4], h[5])
return 1
"#
);

/// Deletes the record and the journal (`KEYS[2]`), whatever their state,
/// and wakes whoever waits. Answers 1 if there was a record.
const FORGET: &str = concat!(
    notify!(),
    r#"
local h = redis.call('HMGET', rec, 's', 'k')
local existed = redis.call('DEL', rec)
redis.call('DEL', KEYS[2])
notify('1', h[1], h[2])
return existed
"#
);

/// Whether the record is in progress under the claim `ARGV[1]`: what
/// fences every journal write.
macro_rules! fenced {
    () => {
        r#"
local r = redis.call('HMGET', rec, 'st', 'tok')
if r[1] ~= 'in_progress' or r[2] ~= ARGV[1] then
  return {'lost'}
end
local jrn = KEYS[2]
local p = ARGV[2] .. ':'
local function keep(exp)
  local until_ = redis.call('PEXPIRETIME', jrn)
  if until_ < exp then
    redis.call('PEXPIREAT', jrn, int(exp))
  end
end
"#
    };
}

/// Begins step `ARGV[2]` (named `ARGV[3]`, fingerprint `ARGV[4]`, kept
/// `ARGV[5]` ms) for the claim `ARGV[1]`; `ARGV[6]` is `1` to adopt a step
/// in doubt started at least `ARGV[7]` ms ago (its settle window).
/// Answers `{'run', fresh|adopted|allowed, state, token, updated}` after
/// marking it started (with what the entry held before: nothing for
/// `fresh`), `{'lost'}` when the claim does not hold the record, or
/// `{'found', now, name, fp, state, token, output, updated, expires}` for
/// `journal::decide_step`.
const BEGIN_STEP: &str = concat!(
    fenced!(),
    r#"
local e = redis.call('HMGET', jrn, p .. 'n', p .. 'fp', p .. 'st', p .. 'tok', p .. 'out', p .. 'u', p .. 'e')
local run = false
if not e[1] or tonumber(e[7]) <= now then
  run = 'fresh'
elseif e[2] == ARGV[4] and e[1] == ARGV[3] then
  if e[3] == 'started' and e[4] ~= ARGV[1] and ARGV[6] == '1'
    and tonumber(e[6]) + tonumber(ARGV[7]) <= now then
    run = 'adopted'
  elseif e[3] == 'rerun_allowed' then
    run = 'allowed'
  end
end
if not run then
  return {'found', int(now), e[1], e[2], e[3], e[4], e[5], e[6], e[7]}
end
local exp = now + tonumber(ARGV[5])
redis.call('HSET', jrn, p .. 'n', ARGV[3], p .. 'fp', ARGV[4], p .. 'st', 'started',
  p .. 'tok', ARGV[1], p .. 'u', int(now), p .. 'e', int(exp))
redis.call('HDEL', jrn, p .. 'out')
keep(exp)
if run == 'fresh' then
  return {'run', run}
end
return {'run', run, e[3], e[4], e[6]}
"#
);

/// Undoes the start of step `ARGV[2]` (named `ARGV[3]`) by the claim
/// `ARGV[1]`, whose marker no replica acknowledged, so its call did not
/// run: the entry is put back as it was (`ARGV[4]` state, `ARGV[5]`
/// token, `ARGV[6]` updated), or removed when there was none (`ARGV[4]`
/// empty). Only while the entry is still this claim's start; answers 1
/// if it was undone, else 0.
const ABANDON_STEP: &str = r#"
local jrn = KEYS[2]
local p = ARGV[2] .. ':'
local e = redis.call('HMGET', jrn, p .. 'n', p .. 'st', p .. 'tok')
if e[1] ~= ARGV[3] or e[2] ~= 'started' or e[3] ~= ARGV[1] then
  return 0
end
if ARGV[4] == '' then
  redis.call('HDEL', jrn, p .. 'n', p .. 'fp', p .. 'st', p .. 'tok', p .. 'out', p .. 'u', p .. 'e')
else
  redis.call('HSET', jrn, p .. 'st', ARGV[4], p .. 'tok', ARGV[5], p .. 'u', ARGV[6])
end
return 1
"#;

/// Journals the output `ARGV[6]` of step `ARGV[2]` (named `ARGV[3]`,
/// fingerprint `ARGV[4]`, kept `ARGV[5]` ms) for the claim `ARGV[1]`.
/// Answers `{'ok'}` (also when the entry already holds this output),
/// `{'lost'}`, or `{'gone'}` when the entry is another step's, or was
/// completed otherwise meanwhile.
const COMPLETE_STEP: &str = concat!(
    fenced!(),
    r#"
local e = redis.call('HMGET', jrn, p .. 'n', p .. 'st', p .. 'out')
if (e[1] == ARGV[3] and e[2] ~= 'completed') or not e[1] then
  local exp = now + tonumber(ARGV[5])
  redis.call('HSET', jrn, p .. 'n', ARGV[3], p .. 'fp', ARGV[4], p .. 'st', 'completed',
    p .. 'tok', ARGV[1], p .. 'out', ARGV[6], p .. 'u', int(now), p .. 'e', int(exp))
  keep(exp)
  return {'ok'}
end
if e[3] == ARGV[6] then
  return {'ok'}
end
return {'gone'}
"#
);

/// An operator settles step `ARGV[1]` (named `ARGV[2]`) of the journal at
/// `KEYS[2]`: `ARGV[3]` is `completed` (with the output `ARGV[4]`) or
/// `rerun`. Answers 1, or 0 when no live entry of that name is started.
const RESOLVE_STEP: &str = r#"
local jrn = KEYS[2]
local p = ARGV[1] .. ':'
local e = redis.call('HMGET', jrn, p .. 'n', p .. 'st', p .. 'e', p .. 'tok')
if e[1] ~= ARGV[2] or e[2] == 'completed' or tonumber(e[3]) <= now then
  return 0
end
-- The attempt that started it still holds the operation: not in doubt.
local r = redis.call('HMGET', rec, 'st', 'tok', 'lease')
if r[1] == 'in_progress' and r[2] == e[4] and r[3] and tonumber(r[3]) > now then
  return 0
end
if ARGV[3] == 'completed' then
  redis.call('HSET', jrn, p .. 'st', 'completed', p .. 'out', ARGV[4], p .. 'u', int(now))
else
  redis.call('HSET', jrn, p .. 'st', 'rerun_allowed', p .. 'u', int(now))
end
return 1
"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// Each transition has a script of its own: no two fields of
    /// `SCRIPTS` hold the same code (a copy-paste slip would make one
    /// transition run another's script).
    #[test]
    fn every_transition_has_its_own_script() {
        let s = &*SCRIPTS;
        let all = [
            &s.claim,
            &s.peek,
            &s.look,
            &s.renew,
            &s.complete,
            &s.release,
            &s.forget,
            &s.begin_step,
            &s.abandon_step,
            &s.complete_step,
            &s.resolve_step,
            &s.keep_steps,
        ];
        let hashes: std::collections::HashSet<_> = all
            .iter()
            .map(|lua| lua.on("k").evalsha().get_packed_command())
            .collect();
        assert_eq!(hashes.len(), all.len());
    }
}
