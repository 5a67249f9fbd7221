#include "registry/redis/registry_scripts.h"

namespace setpoint::redis {

// Shared by the scripts: server time, quoting of foreign values, type
// checks that refuse keys someone else filled with another type, the
// server's run id (it changes on every restart and failover), and exact
// decimal arithmetic on strings for tokens and versions (Lua's numbers are
// doubles: past 2^53 they are no longer exact).
extern const char kPrelude[] = R"lua(
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end
local function num(n) return string.format('%.0f', n) end
local function quote(v)
  v = tostring(v)
  local s = string.gsub(string.sub(v, 1, 64), '[%c"\\\127-\255]',
    function(c) return string.format('\\x%02x', string.byte(c)) end)
  if #v > 64 then s = s .. '...' end
  return '"' .. s .. '"'
end
local function wrong_type(key, want)
  local ty = redis.call('TYPE', key)['ok']
  if ty ~= 'none' and ty ~= want then
    return 'SETPOINT_GARBAGE key ' .. key .. ' holds a ' .. ty ..
           ', not a ' .. want .. '; remove it'
  end
  return nil
end
local function run_id()
  local info = redis.call('INFO', 'server')
  return string.match(info, 'run_id:(%x+)') or 'unknown'
end
local U64_MAX = '18446744073709551615'
local function dec_ok(s)
  return type(s) == 'string' and #s >= 1 and #s <= 20 and
         string.match(s, '^%d+$') ~= nil and not (#s == 20 and s > U64_MAX)
end
local function strip(s)
  local t = string.gsub(s, '^0+', '')
  if t == '' then return '0' end
  return t
end
local function dec_lt(a, b)
  a, b = strip(a), strip(b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local function dec_incr(s)
  s = strip(s)
  local out, carry = {}, 1
  for i = #s, 1, -1 do
    local d = string.byte(s, i) - 48 + carry
    if d == 10 then d, carry = 0, 1 else carry = 0 end
    out[i] = string.char(48 + d)
  end
  local r = table.concat(out)
  if carry == 1 then r = '1' .. r end
  return r
end
local function bump_version(key)
  local v = redis.call('GET', key)
  if not dec_ok(v) then v = '0' end
  local n = dec_incr(v)
  if not dec_ok(n) then n = '1' end
  redis.call('SET', key, n)
  return n
end
-- A held record, "<begin> <end> [<begin> <end> ...] <token>": its runs
-- (sorted, disjoint, none empty) and its token; nil when it is not exactly
-- that.
local function runs_text(runs)
  local parts = {}
  for i = 1, #runs do
    parts[#parts + 1] = num(runs[i][1]) .. ' ' .. num(runs[i][2])
  end
  return table.concat(parts, ' ')
end
-- The one spelling runs_text writes: single spaces, no leading zeros in
-- the runs (checked on the words, without formatting them back: every
-- grant reads every record).
local function parse_runs(s, need_token)
  if type(s) ~= 'string' or #s > 100000 then return nil end
  local words, len = {}, 0
  for w in string.gmatch(s, '[^ ]+') do
    if #w > 20 or not string.match(w, '^%d+$') then return nil end
    words[#words + 1] = w
    len = len + #w
  end
  if len + math.max(#words - 1, 0) ~= #s then return nil end
  local tok = nil
  if need_token then
    if #words < 3 or #words % 2 == 0 then return nil end
    tok = table.remove(words)
  elseif #words % 2 == 1 then
    return nil
  end
  local runs, last = {}, -1
  for i = 1, #words do
    local w = words[i]
    if #w > 1 and string.byte(w, 1) == 48 then return nil end
  end
  for i = 1, #words, 2 do
    local b, e = tonumber(words[i]), tonumber(words[i + 1])
    if b >= e or b <= last or e > 4294967295 then return nil end
    runs[#runs + 1] = {b, e}
    last = e
  end
  return runs, tok
end
local function parse_held(v) return parse_runs(v, true) end
local function runs_overlap(a, b)
  local i, j = 1, 1
  while i <= #a and j <= #b do
    if a[i][1] < b[j][2] and b[j][1] < a[i][2] then return true end
    if a[i][2] <= b[j][2] then i = i + 1 else j = j + 1 end
  end
  return false
end
-- The shards of `a` that are not in `b`, as runs.
local function runs_minus(a, b)
  local out, j = {}, 1
  for i = 1, #a do
    local lo, hi = a[i][1], a[i][2]
    while j <= #b and b[j][2] <= lo do j = j + 1 end
    local k = j
    while lo < hi and k <= #b and b[k][1] < hi do
      if b[k][1] > lo then out[#out + 1] = {lo, b[k][1]} end
      lo = math.max(lo, b[k][2])
      k = k + 1
    end
    if lo < hi then out[#out + 1] = {lo, hi} end
  end
  return out
end
-- The change log of a kind's members and records, so that a pod can read
-- what changed since its last poll instead of every member and record:
-- a list (key "changes") of "<seq> <op> <#id> <id><value>" and its counter
-- (key "changes_seq"). op: '+' a member joined, '-' a member left with its
-- record, 'h' the record was set to <value>, 'd' the record was dropped.
-- Only the newest CHANGES_MAX entries are kept; a pod further behind reads
-- everything. A counter that does not hold a count starts over (the pods
-- then read everything).
local CHANGES_MAX = 4096
-- What this script logged, per log key in the order first logged, for its
-- announcement: the pods apply it to their cached views instead of polling.
local logged, logged_keys = {}, {}
local function log_change(logkey, seqkey, op, id, value)
  local n = tonumber(redis.call('GET', seqkey) or '0')
  if not n or n < 0 or n >= 2^52 or n ~= math.floor(n) then n = 0 end
  n = n + 1
  redis.call('SET', seqkey, num(n))
  local entry = num(n) .. ' ' .. op .. ' ' .. #id .. ' ' .. id .. (value or '')
  local len = redis.call('RPUSH', logkey, entry)
  if len > CHANGES_MAX then
    redis.call('LTRIM', logkey, -CHANGES_MAX, -1)
  end
  if not logged[logkey] then
    logged[logkey] = {}
    table.insert(logged_keys, logkey)
  end
  table.insert(logged[logkey], entry)
end
-- Publishes `base` (the writer's name) with what this script logged,
-- "\tc\t<log key>\t<n>\t<entry>..." per log key, then `tail` (the freed
-- shards: "\tf\t<kind>\t<b>-<e>,..."). Too long, or an entry that holds
-- a tab: without the entries (the pods then poll), then without the tail.
local function announce(channel, base, tail)
  tail = tail or ''
  local parts = {base}
  local ok = true
  for _, key in ipairs(logged_keys) do
    local entries = logged[key]
    if string.find(key, '\t', 1, true) then ok = false end
    for _, e in ipairs(entries) do
      if string.find(e, '\t', 1, true) then ok = false end
    end
    table.insert(parts, 'c')
    table.insert(parts, key)
    table.insert(parts, tostring(#entries))
    for _, e in ipairs(entries) do table.insert(parts, e) end
  end
  local msg = table.concat(parts, '\t') .. tail
  if not ok or #msg > 32000 then msg = base .. tail end
  if #msg > 32000 then msg = base end
  redis.call('PUBLISH', channel, msg)
end
local function wrong_log(logkey, seqkey)
  return wrong_type(logkey, 'list') or wrong_type(seqkey, 'string')
end
local function parse_gf(gfs)
  if gfs and #gfs <= 15 and string.match(gfs, '^%d+$') then
    return tonumber(gfs)
  end
  return nil
end
)lua";

// KEYS: epoch, grants_from, run, version, drained, kinds, clamped (kind ->
// the epoch whose leases were clamped), then members, held, token, changes,
// changes_seq per kind.
// ARGV: lease_ms, fresh epoch id, channel, kinds, min_version, message,
// own held only ('1': the held records of the given ids only), the epoch
// of the caller's cached view ('' for none), then per kind: kind, ring size
// ('' for none), min token ('' for none), the change seq the caller's view
// is at ('' to read everything), n, ids...
// Starts a new epoch when the state is missing, was written under another
// server run (a restart or failover: it may be an older snapshot) or is
// older than a version the caller saw; renews the given members, expires
// dead ones with their held ranges, and returns
// {epoch, grants_from, now, version, new_epoch_reason, views, warnings,
// drained}, and records each kind (with its ring size, when given) for
// Describe. views holds four elements per kind: 'f', the change seq the
// view is at ('' when it cannot be cached), live members, held records
// (flat id, value); 'd', the seq reached, the changes after the caller's
// seq, the held records of the given ids (flat id, value): only while the
// epoch is the caller's and the log still has every change since; 'o'
// (own held only), '', live members, the given ids' records.
extern const char kPollScript[] = R"lua(
local now = now_ms()
local lease = tonumber(ARGV[1])
local min_version = ARGV[5]
local nkinds = tonumber(ARGV[4])
local warnings = {}
for i = 1, 4 do
  local e = wrong_type(KEYS[i], 'string')
  if e then return redis.error_reply(e) end
end
do
  local e = wrong_type(KEYS[5], 'hash') or wrong_type(KEYS[6], 'hash') or
            wrong_type(KEYS[7], 'hash')
  if e then return redis.error_reply(e) end
end
for k = 1, nkinds do
  local b = 7 + 5 * (k - 1)
  local e = wrong_type(KEYS[b + 1], 'zset') or wrong_type(KEYS[b + 2], 'hash') or
            wrong_type(KEYS[b + 3], 'string') or
            wrong_log(KEYS[b + 4], KEYS[b + 5])
  if e then return redis.error_reply(e) end
  local tok = redis.call('GET', KEYS[b + 3])
  if tok and not dec_ok(tok) then
    return redis.error_reply('SETPOINT_GARBAGE key ' .. KEYS[b + 3] ..
      ' holds ' .. quote(tok) .. ', not a token (a decimal integer below ' ..
      '2^64); no grant is possible until it is set to a number at least ' ..
      'as large as every token granted')
  end
end
local epoch = redis.call('GET', KEYS[1])
local run = run_id()
local version = redis.call('GET', KEYS[4])
local reason = ''
if not epoch then
  reason = 'no state (first start, or redis lost its data)'
elseif redis.call('GET', KEYS[3]) ~= run then
  reason = 'redis restarted or failed over (its run id changed): its ' ..
           'state may be older than what the pods saw'
elseif not dec_ok(version) then
  reason = 'key ' .. KEYS[4] .. ' holds ' .. quote(version or '(nothing)') ..
           ', not a version'
elseif dec_lt(version, min_version) then
  reason = 'the state went back in time (version ' .. version ..
           ' is older than ' .. min_version .. ', seen by a pod)'
end
local changed = false
if reason ~= '' then
  local base = '0'
  if dec_ok(version) then base = version end
  if dec_lt(base, min_version) then base = min_version end
  version = dec_incr(base)
  epoch = ARGV[2]
  redis.call('SET', KEYS[1], epoch)
  redis.call('SET', KEYS[3], run)
  redis.call('SET', KEYS[2], num(now + lease))
  changed = true
else
  version = dec_incr(version)
end
if not dec_ok(version) then version = '1' end
redis.call('SET', KEYS[4], version)
local gfs = redis.call('GET', KEYS[2])
local gf = parse_gf(gfs)
if not gf or gf > now + 2 * lease then
  table.insert(warnings, 'key ' .. KEYS[2] .. ' holds ' ..
    quote(gfs or '(nothing)') .. ', expected a server time in ms no later ' ..
    'than ' .. num(now + 2 * lease) .. '; reset to one lease from now')
  gf = now + lease
  redis.call('SET', KEYS[2], num(gf))
end
local views = {}
local own_only = ARGV[7] == '1'
local cached_epoch = ARGV[8]
local ai = 9
local horizon = now + 2 * lease
for k = 1, nkinds do
  local b = 7 + 5 * (k - 1)
  local members, held = KEYS[b + 1], KEYS[b + 2]
  local log, seqkey = KEYS[b + 4], KEYS[b + 5]
  local kind = ARGV[ai]
  local ring = ARGV[ai + 1]
  local min_token = ARGV[ai + 2]
  local since = tonumber(ARGV[ai + 3])
  local n = tonumber(ARGV[ai + 4])
  ai = ai + 5
  -- Tokens never go back: the counter is at least the highest token a pod
  -- holds or has seen (a failover may have lost the grants that raised it,
  -- and the new primary's clock may be behind).
  if dec_ok(min_token) then
    local tok = redis.call('GET', KEYS[b + 3]) or '0'
    if dec_lt(tok, min_token) then redis.call('SET', KEYS[b + 3], min_token) end
  end
  -- Once per epoch and kind: no lease ends later than one lease from now.
  -- Members restored from an older state (lost in a failover's lag, on a
  -- primary whose clock is behind) then expire at the end of the epoch's
  -- grace, with what they hold, instead of blocking it for longer.
  if redis.call('HGET', KEYS[7], kind) ~= epoch then
    local far = redis.call('ZRANGEBYSCORE', members, '(' .. num(now + lease),
                           '+inf')
    for _, id in ipairs(far) do
      redis.call('ZADD', members, num(now + lease), id)
    end
    redis.call('HSET', KEYS[7], kind, epoch)
  end
  if ring ~= '' then
    if redis.call('HGET', KEYS[6], kind) ~= ring then
      redis.call('HSET', KEYS[6], kind, ring)
    end
  elseif redis.call('HEXISTS', KEYS[6], kind) == 0 then
    redis.call('HSET', KEYS[6], kind, '')
  end
  local dead = redis.call('ZRANGEBYSCORE', members, '-inf', num(now))
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', members, '-inf', num(now))
    for _, id in ipairs(dead) do
      redis.call('HDEL', held, id)
      log_change(log, seqkey, '-', id)
    end
    changed = true
  end
  local own = {}
  for i = 1, n do
    if redis.call('ZADD', members, num(now + lease), ARGV[ai]) == 1 then
      log_change(log, seqkey, '+', ARGV[ai])
      changed = true
    end
    table.insert(own, ARGV[ai])
    ai = ai + 1
  end
  local function live()
    -- Ids that are not "<pod>/<kind>/<index>" are left out by the pods
    -- themselves (DecodePollReply), not here: Redis serves every pod.
    return redis.call('ZRANGEBYSCORE', members, '(' .. num(now), num(horizon))
  end
  local far = redis.call('ZCOUNT', members, '(' .. num(horizon), '+inf')
  if far > 0 then
    local ex = redis.call('ZRANGEBYSCORE', members, '(' .. num(horizon),
                          '+inf', 'LIMIT', 0, 3)
    for i = 1, #ex do ex[i] = quote(ex[i]) end
    table.insert(warnings, 'key ' .. members .. ': ' .. far ..
      ' member(s) have a lease that ends more than two leases from now ' ..
      '(no pod with this lease wrote it) and get no shards; what they ' ..
      'hold stays blocked until they expire or are removed: ' ..
      table.concat(ex, ', '))
  end
  local function own_records()
    local flat = {}
    for i = 1, #own, 1000 do
      local part = {unpack(own, i, math.min(#own, i + 999))}
      local vals = redis.call('HMGET', held, unpack(part))
      for j = 1, #part do
        if vals[j] then
          table.insert(flat, part[j])
          table.insert(flat, vals[j])
        end
      end
    end
    return flat
  end
  -- Members are cacheable when none is beyond the horizon (the view leaves
  -- those out, and they come back without a change).
  local seq = tonumber(redis.call('GET', seqkey) or '0')
  if seq and (seq < 0 or seq ~= math.floor(seq)) then seq = nil end
  -- The newest entry is at `seq`: the changes after `since` are the last
  -- seq - since entries, if the log still has that many (the caller checks
  -- their seqs).
  local changes = nil
  if far == 0 and seq and since and reason == '' and cached_epoch == epoch and
     since <= seq then
    local need = seq - since
    if need == 0 then
      changes = {}
    elseif need <= redis.call('LLEN', log) then
      changes = redis.call('LRANGE', log, -need, -1)
    end
  end
  if own_only then
    table.insert(views, 'o')
    table.insert(views, '')
    table.insert(views, live())
    table.insert(views, own_records())
  elseif changes then
    table.insert(views, 'd')
    table.insert(views, num(seq))
    table.insert(views, changes)
    table.insert(views, own_records())
  else
    table.insert(views, 'f')
    table.insert(views, (far == 0 and seq) and num(seq) or '')
    table.insert(views, live())
    table.insert(views, redis.call('HGETALL', held))
  end
end
if changed then announce(ARGV[3], ARGV[6]) end
return {epoch, num(gf), num(now), version, reason, views, warnings,
        redis.call('HGETALL', KEYS[5])}
)lua";

// KEYS: members, held, version, changes, changes_seq. ARGV: node, runs
// ("<b> <e> ..." of what the node keeps; '' for nothing), token, channel,
// message.
// Shrinks the node's record to the kept runs if it is recorded under
// `token` and covers them; nothing kept drops whatever is recorded.
extern const char kReleaseScript[] = R"lua(
local e = wrong_type(KEYS[2], 'hash') or wrong_type(KEYS[3], 'string') or
          wrong_log(KEYS[4], KEYS[5])
if e then return redis.error_reply(e) end
local cur = redis.call('HGET', KEYS[2], ARGV[1])
local keep = parse_runs(ARGV[2], false)
if not keep then return redis.error_reply('release: bad runs') end
if #keep == 0 then
  if cur then
    redis.call('HDEL', KEYS[2], ARGV[1])
    log_change(KEYS[4], KEYS[5], 'd', ARGV[1])
    bump_version(KEYS[3])
    announce(ARGV[4], ARGV[5])
  end
  return 'OK'
end
if not cur then
  return redis.error_reply('SETPOINT_PRECONDITION the registry records ' ..
                           'nothing for the node')
end
local cruns, ct = parse_held(cur)
if not cruns then
  return redis.error_reply('SETPOINT_PRECONDITION held value ' .. quote(cur) ..
                           ' does not parse')
end
if strip(ct) ~= strip(ARGV[3]) then
  return redis.error_reply('SETPOINT_PRECONDITION the record has token ' ..
                           ct .. ', not ' .. ARGV[3])
end
if #runs_minus(keep, cruns) > 0 then
  return redis.error_reply('SETPOINT_PRECONDITION not within the recorded ' ..
                           'shards ' .. quote(cur))
end
local v = runs_text(keep) .. ' ' .. ct
if v ~= cur then
  redis.call('HSET', KEYS[2], ARGV[1], v)
  log_change(KEYS[4], KEYS[5], 'h', ARGV[1], v)
end
bump_version(KEYS[3])
announce(ARGV[4], ARGV[5])
return 'OK'
)lua";

// KEYS: epoch, grants_from, run, version, members, held, token, changes,
// changes_seq. ARGV: node, runs ("<b> <e> ..."), channel, epoch, message.
// Grants the runs if the state is still the epoch the caller polled, the
// node is live, grants are allowed, and no other live member holds any of
// it. Tokens only grow, also across a loss of Redis's state: each is at
// least the server time in microseconds. A grant announces its change-log
// entry ("\tg" at the end: nothing became free, nobody needs to poll), so
// that the pods' cached views stay complete without a poll.
extern const char kGrantScript[] = R"lua(
local now, t = now_ms()
for i = 1, 4 do
  local e = wrong_type(KEYS[i], 'string')
  if e then return redis.error_reply(e) end
end
local e = wrong_type(KEYS[5], 'zset') or wrong_type(KEYS[6], 'hash') or
          wrong_type(KEYS[7], 'string') or wrong_log(KEYS[8], KEYS[9])
if e then return redis.error_reply(e) end
local epoch = redis.call('GET', KEYS[1])
if epoch ~= ARGV[4] or redis.call('GET', KEYS[3]) ~= run_id() then
  return redis.error_reply('SETPOINT_ABORTED the registry state changed ' ..
    'since the poll (epoch ' .. quote(epoch or '(none)') .. ', the pod saw ' ..
    quote(ARGV[4]) .. ', or redis restarted); poll again')
end
local gfs = redis.call('GET', KEYS[2])
local gf = parse_gf(gfs)
if not gf then
  return redis.error_reply('SETPOINT_ABORTED key ' .. KEYS[2] .. ' holds ' ..
    quote(gfs or '(nothing)') .. ', not a time; the next poll repairs it')
end
if now < gf then
  return redis.error_reply('SETPOINT_ABORTED grants refused for ' ..
    num(gf - now) .. ' ms more, until the registry state is one lease old')
end
local score = redis.call('ZSCORE', KEYS[5], ARGV[1])
if not score or tonumber(score) <= now then
  return redis.error_reply('SETPOINT_NOT_MEMBER not a live member (lease expired)')
end
local want = parse_runs(ARGV[2], false)
if not want or #want == 0 then return redis.error_reply('grant: bad runs') end
local held = redis.call('HGETALL', KEYS[6])
for i = 1, #held, 2 do
  local id = held[i]
  if id ~= ARGV[1] then
    local s = redis.call('ZSCORE', KEYS[5], id)
    if s and tonumber(s) > now then
      local oruns = parse_held(held[i + 1])
      if not oruns then
        return redis.error_reply('SETPOINT_ABORTED held value of ' ..
          quote(id) .. ' is ' .. quote(held[i + 1]) .. ' and does not ' ..
          'parse (expected "<begin> <end> [<begin> <end> ...] <token>"); ' ..
          'treated as holding everything')
      end
      if runs_overlap(want, oruns) then
        return redis.error_reply('SETPOINT_ABORTED shards still held by ' ..
                                 id .. ' ' .. quote(held[i + 1]))
      end
    end
  end
end
local last = redis.call('GET', KEYS[7]) or '0'
if not dec_ok(last) then
  return redis.error_reply('SETPOINT_GARBAGE key ' .. KEYS[7] .. ' holds ' ..
    quote(last) .. ', not a token (a decimal integer below 2^64)')
end
local floor = num(tonumber(t[1]) * 1000000 + tonumber(t[2]))
local token = dec_incr(last)
if dec_lt(token, floor) then token = floor end
if not dec_ok(token) then
  return redis.error_reply('SETPOINT_GARBAGE key ' .. KEYS[7] ..
    ' is at the largest token; no further grant is possible')
end
redis.call('SET', KEYS[7], token)
redis.call('HSET', KEYS[6], ARGV[1], runs_text(want) .. ' ' .. token)
log_change(KEYS[8], KEYS[9], 'h', ARGV[1], runs_text(want) .. ' ' .. token)
bump_version(KEYS[4])
announce(ARGV[3], ARGV[5], '\tg')
return token
)lua";

// KEYS: epoch, grants_from, run, version, then members, held, token,
// changes, changes_seq per kind. ARGV: channel, message, epoch, kinds, then per
// kind: kind, releases n, n x (node, kept runs "<b> <e> ..." ('' for none),
// token), grants m, m x (node, runs). Runs every release as kReleaseScript
// does, then every grant as kGrantScript does (each seeing the ones before it),
// and announces once if anything changed, with what it logged (announce):
// after releases "\tf\t<kind>\t<b>-<e>,..." names the shards that became
// free; after grants only, "\tg".
// Returns one array per kind: a result per release, then per grant: 'OK', 'T
// <token>' or 'E <error>'.
extern const char kHandoffScript[] = R"lua(
for i = 1, 4 do
  local e = wrong_type(KEYS[i], 'string')
  if e then return redis.error_reply(e) end
end
local nkinds = tonumber(ARGV[4])
for k = 1, nkinds do
  local b = 4 + 5 * (k - 1)
  local e = wrong_type(KEYS[b + 1], 'zset') or wrong_type(KEYS[b + 2], 'hash') or
            wrong_type(KEYS[b + 3], 'string') or
            wrong_log(KEYS[b + 4], KEYS[b + 5])
  if e then return redis.error_reply(e) end
end
local now, t = now_ms()
local released, granted = false, false
local notice, unknown = '', false
local common = nil  -- Refuses every grant: the state changed, or grace.
local checked = false
local out = {}
local ai = 5
for k = 1, nkinds do
  local b = 4 + 5 * (k - 1)
  local members, held, tokkey = KEYS[b + 1], KEYS[b + 2], KEYS[b + 3]
  local log, seqkey = KEYS[b + 4], KEYS[b + 5]
  local kname = ARGV[ai]
  ai = ai + 1
  local res = {}
  local refused = {}
  local freed = {}
  local function free(runs)
    for i = 1, #runs do
      table.insert(freed, num(runs[i][1]) .. '-' .. num(runs[i][2]))
    end
  end
  local nrel = tonumber(ARGV[ai])
  ai = ai + 1
  for r = 1, nrel do
    local node, rs, rt = ARGV[ai], ARGV[ai + 1], ARGV[ai + 2]
    ai = ai + 3
    local keep = parse_runs(rs, false)
    if not keep then return redis.error_reply('handoff: bad runs') end
    local cur = redis.call('HGET', held, node)
    local err = nil
    if #keep == 0 then
      if cur then
        redis.call('HDEL', held, node)
        log_change(log, seqkey, 'd', node)
        released = true
        local cruns = parse_held(cur)
        if cruns then
          free(cruns)
        else
          unknown = true
        end
      end
    elseif not cur then
      err = 'SETPOINT_PRECONDITION the registry records nothing for the node'
    else
      local cruns, ct = parse_held(cur)
      if not cruns then
        err = 'SETPOINT_PRECONDITION held value ' .. quote(cur) ..
              ' does not parse'
      elseif strip(ct) ~= strip(rt) then
        err = 'SETPOINT_PRECONDITION the record has token ' .. ct ..
              ', not ' .. rt
      elseif #runs_minus(keep, cruns) > 0 then
        err = 'SETPOINT_PRECONDITION not within the recorded shards ' ..
              quote(cur)
      else
        local v = runs_text(keep) .. ' ' .. ct
        if v ~= cur then
          redis.call('HSET', held, node, v)
          log_change(log, seqkey, 'h', node, v)
          released = true
          free(runs_minus(cruns, keep))
        end
      end
    end
    if err then
      refused[node] = true
      table.insert(res, 'E ' .. err)
    else
      table.insert(res, 'OK')
    end
  end
  local ngr = tonumber(ARGV[ai])
  ai = ai + 1
  if ngr > 0 then
    if not checked then
      checked = true
      local epoch = redis.call('GET', KEYS[1])
      local gf = parse_gf(redis.call('GET', KEYS[2]))
      if epoch ~= ARGV[3] or redis.call('GET', KEYS[3]) ~= run_id() then
        common = 'SETPOINT_ABORTED the registry state changed since the ' ..
          'poll (epoch ' .. quote(epoch or '(none)') .. ', the pod saw ' ..
          quote(ARGV[3]) .. ', or redis restarted); poll again'
      elseif not gf then
        common = 'SETPOINT_ABORTED key ' .. KEYS[2] .. ' does not hold a ' ..
          'time; the next poll repairs it'
      elseif now < gf then
        common = 'SETPOINT_ABORTED grants refused for ' .. num(gf - now) ..
          ' ms more, until the registry state is one lease old'
      end
    end
    -- What live members hold where these grants reach, read once for all
    -- of them: a record that meets none of the granted shards cannot
    -- conflict, so only the others (and those that do not parse) need a
    -- liveness check and a look from each grant. A pod's nodes want
    -- shards all over the ring, so the test is against the union of what
    -- they want, not its hull.
    local function is_live(id)
      local sc = redis.call('ZSCORE', members, id)
      return sc ~= false and sc ~= nil and tonumber(sc) > now
    end
    local wants, all = {}, {}
    for g = 0, ngr - 1 do
      local w = parse_runs(ARGV[ai + 2 * g + 1], false)
      if not w or #w == 0 then return redis.error_reply('handoff: bad runs') end
      wants[g + 1] = w
      for i = 1, #w do all[#all + 1] = w[i] end
    end
    table.sort(all, function(x, y) return x[1] < y[1] end)
    local union = {}
    for i = 1, #all do
      local u = union[#union]
      if u and all[i][1] <= u[2] then
        if all[i][2] > u[2] then u[2] = all[i][2] end
      else
        union[#union + 1] = {all[i][1], all[i][2]}
      end
    end
    local function meets(runs)
      for i = 1, #runs do
        -- The first run of the union that ends after this one begins.
        local l, r = 1, #union + 1
        while l < r do
          local m = math.floor((l + r) / 2)
          if union[m][2] > runs[i][1] then r = m else l = m + 1 end
        end
        if l <= #union and union[l][1] < runs[i][2] then return true end
      end
      return false
    end
    local ranges = {}
    local h = redis.call('HGETALL', held)
    for i = 1, #h, 2 do
      local oruns = parse_held(h[i + 1])
      if not oruns then
        if is_live(h[i]) then ranges[h[i]] = quote(h[i + 1]) end
      elseif meets(oruns) and is_live(h[i]) then
        ranges[h[i]] = oruns
      end
    end
    local live = {}
    for g = 0, ngr - 1 do
      local id = ARGV[ai + 2 * g]
      if live[id] == nil then live[id] = is_live(id) end
    end
    local last = redis.call('GET', tokkey) or '0'
    for g = 1, ngr do
      local node = ARGV[ai]
      local want = wants[g]
      ai = ai + 2
      local err = common
      if not err and refused[node] then
        err = 'SETPOINT_ABORTED its release in the same handoff failed'
      end
      if not err and not live[node] then
        err = 'SETPOINT_NOT_MEMBER not a live member (lease expired)'
      end
      if not err then
        for id, r in pairs(ranges) do
          if id ~= node then
            if type(r) == 'string' then
              err = 'SETPOINT_ABORTED held value of ' .. quote(id) .. ' is ' ..
                r .. ' and does not parse (expected "<begin> <end> ' ..
                '[<begin> <end> ...] <token>"); treated as holding everything'
            elseif runs_overlap(want, r) then
              err = 'SETPOINT_ABORTED shards still held by ' .. id .. ' ' ..
                quote(runs_text(r))
            end
            if err then break end
          end
        end
      end
      if not err and not dec_ok(last) then
        err = 'SETPOINT_GARBAGE key ' .. tokkey .. ' holds ' .. quote(last) ..
              ', not a token (a decimal integer below 2^64)'
      end
      local token = nil
      if not err then
        local floor = num(tonumber(t[1]) * 1000000 + tonumber(t[2]))
        token = dec_incr(last)
        if dec_lt(token, floor) then token = floor end
        if not dec_ok(token) then
          err = 'SETPOINT_GARBAGE key ' .. tokkey ..
                ' is at the largest token; no further grant is possible'
        end
      end
      if err then
        table.insert(res, 'E ' .. err)
      else
        last = token
        redis.call('SET', tokkey, token)
        local v = runs_text(want) .. ' ' .. token
        redis.call('HSET', held, node, v)
        log_change(log, seqkey, 'h', node, v)
        ranges[node] = want
        granted = true
        table.insert(res, 'T ' .. token)
      end
    end
  end
  table.insert(out, res)
  if #freed > 0 then
    notice = notice .. '\t' .. kname .. '\t' .. table.concat(freed, ',')
  end
end
if released or granted then bump_version(KEYS[4]) end
if released then
  -- Says which shards became free, so that only the pods waiting for them
  -- look again; without it (poll) when that is unknown.
  announce(ARGV[1], ARGV[2], (not unknown) and ('\tf' .. notice) or '')
elseif granted then
  announce(ARGV[1], ARGV[2], '\tg')
end
return out
)lua";

// KEYS: members, held, version, changes, changes_seq. ARGV: channel,
// message, ids...
extern const char kDeregisterScript[] = R"lua(
local e = wrong_type(KEYS[1], 'zset') or wrong_type(KEYS[2], 'hash') or
          wrong_type(KEYS[3], 'string') or wrong_log(KEYS[4], KEYS[5])
if e then return redis.error_reply(e) end
for i = 3, #ARGV do
  local gone = redis.call('ZREM', KEYS[1], ARGV[i])
  if redis.call('HDEL', KEYS[2], ARGV[i]) + gone > 0 then
    log_change(KEYS[4], KEYS[5], '-', ARGV[i])
  end
end
bump_version(KEYS[3])
announce(ARGV[1], ARGV[2])
return 'OK'
)lua";

// KEYS: drained, version. ARGV: pod, '1' (drain) or '0' (undrain), channel,
// message.
// Records (or removes) the pod's drain flag, the server time in ms when it
// was drained; returns 'OK' after a change, 'UNCHANGED' when it was so.
extern const char kDrainScript[] = R"lua(
local e = wrong_type(KEYS[1], 'hash') or wrong_type(KEYS[2], 'string')
if e then return redis.error_reply(e) end
if ARGV[2] == '1' then
  local now = now_ms()
  if redis.call('HSETNX', KEYS[1], ARGV[1], num(now)) == 0 then
    return 'UNCHANGED'
  end
elseif redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return 'UNCHANGED'
end
bump_version(KEYS[2])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 'OK'
)lua";

// KEYS: kinds. The kinds the pods recorded (with their ring sizes), for
// Describe to name their keys.
extern const char kKindsScript[] = R"lua(
local e = wrong_type(KEYS[1], 'hash')
if e then return redis.error_reply(e) end
return redis.call('HKEYS', KEYS[1])
)lua";

// KEYS: epoch, grants_from, run, version, drained, kinds, then members,
// held, token per kind.
// Reads everything at once and changes nothing: {epoch, grants_from, now,
// version, run_matches, drained, kinds, {members with scores, held, token}
// per kind}; a missing value is ''.
extern const char kDescribeScript[] = R"lua(
local now = now_ms()
for i = 1, 4 do
  local e = wrong_type(KEYS[i], 'string')
  if e then return redis.error_reply(e) end
end
do
  local e = wrong_type(KEYS[5], 'hash') or wrong_type(KEYS[6], 'hash')
  if e then return redis.error_reply(e) end
end
local per = {}
for b = 7, #KEYS, 3 do
  local e = wrong_type(KEYS[b], 'zset') or wrong_type(KEYS[b + 1], 'hash') or
            wrong_type(KEYS[b + 2], 'string')
  if e then return redis.error_reply(e) end
  table.insert(per, redis.call('ZRANGE', KEYS[b], 0, -1, 'WITHSCORES'))
  table.insert(per, redis.call('HGETALL', KEYS[b + 1]))
  table.insert(per, redis.call('GET', KEYS[b + 2]) or '')
end
local run_matches = '1'
if redis.call('GET', KEYS[3]) ~= run_id() then run_matches = '0' end
return {redis.call('GET', KEYS[1]) or '', redis.call('GET', KEYS[2]) or '',
        num(now), redis.call('GET', KEYS[4]) or '', run_matches,
        redis.call('HGETALL', KEYS[5]), redis.call('HGETALL', KEYS[6]), per}
)lua";

}  // namespace setpoint::redis
