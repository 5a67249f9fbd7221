#include "setpoint/registry/redis_node_registry.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "registry/redis/redis_client.h"
#include "registry/redis/registry_codec.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/format.h"
#include "setpoint/base/mutex.h"
#include "spdlog/spdlog.h"

namespace setpoint {
namespace {

using redis::RedisClient;
using redis::RedisReply;
using redis::RedisScript;

// Shared by the scripts: server time, quoting of foreign values, type
// checks that refuse keys someone else filled with another type, the
// server's run id (it changes on every restart and failover), and exact
// decimal arithmetic on strings for tokens and versions (Lua's numbers are
// doubles: past 2^53 they are no longer exact).
constexpr char kPrelude[] = R"lua(
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
local function parse_runs(s, need_token)
  if type(s) ~= 'string' or #s > 100000 then return nil end
  local words = {}
  for w in string.gmatch(s, '[^ ]+') do
    if #w > 20 or not string.match(w, '^%d+$') then return nil end
    words[#words + 1] = w
  end
  local tok = nil
  if need_token then
    if #words < 3 or #words % 2 == 0 then return nil end
    tok = table.remove(words)
  elseif #words % 2 == 1 then
    return nil
  end
  local runs, last = {}, -1
  for i = 1, #words, 2 do
    local b, e = tonumber(words[i]), tonumber(words[i + 1])
    if b >= e or b <= last or e > 4294967295 then return nil end
    runs[#runs + 1] = {b, e}
    last = e
  end
  local canon = runs_text(runs)
  if tok then canon = canon .. ' ' .. tok end
  if canon ~= s then return nil end
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
local function parse_gf(gfs)
  if gfs and #gfs <= 15 and string.match(gfs, '^%d+$') then
    return tonumber(gfs)
  end
  return nil
end
)lua";

// KEYS: epoch, grants_from, run, version, drained, kinds, clamped (kind ->
// the epoch whose leases were clamped), then members, held, token per kind.
// ARGV: lease_ms, fresh epoch id, channel, kinds, min_version, message,
// own held only ('1': the held records of the given ids only), then per
// kind: kind, ring size ('' for none), min token ('' for none), n, ids...
// Starts a new epoch when the state is missing, was written under another
// server run (a restart or failover: it may be an older snapshot) or is
// older than a version the caller saw; renews the given members, expires
// dead ones with their held ranges, and returns
// {epoch, grants_from, now, version, new_epoch_reason, views, warnings,
// drained}, and records each kind (with its ring size, when given) for
// Describe.
constexpr char kPollScript[] = R"lua(
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
  local b = 7 + 3 * (k - 1)
  local e = wrong_type(KEYS[b + 1], 'zset') or wrong_type(KEYS[b + 2], 'hash') or
            wrong_type(KEYS[b + 3], 'string')
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
local ai = 8
local horizon = now + 2 * lease
for k = 1, nkinds do
  local b = 7 + 3 * (k - 1)
  local members, held = KEYS[b + 1], KEYS[b + 2]
  local kind = ARGV[ai]
  local ring = ARGV[ai + 1]
  local min_token = ARGV[ai + 2]
  local n = tonumber(ARGV[ai + 3])
  ai = ai + 4
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
    for _, id in ipairs(dead) do redis.call('HDEL', held, id) end
    changed = true
  end
  local own = {}
  for i = 1, n do
    if redis.call('ZADD', members, num(now + lease), ARGV[ai]) == 1 then
      changed = true
    end
    table.insert(own, ARGV[ai])
    ai = ai + 1
  end
  local live = redis.call('ZRANGEBYSCORE', members, '(' .. num(now),
                          num(horizon))
  -- Ids that are not "<pod>/<kind>/<index>" are left out by the pods
  -- themselves (DecodePollReply), not here: Redis serves every pod.
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
  table.insert(views, live)
  if own_only and #own <= 1000 then
    local flat = {}
    if #own > 0 then
      local vals = redis.call('HMGET', held, unpack(own))
      for i = 1, #own do
        if vals[i] then
          table.insert(flat, own[i])
          table.insert(flat, vals[i])
        end
      end
    end
    table.insert(views, flat)
  else
    table.insert(views, redis.call('HGETALL', held))
  end
end
if changed then redis.call('PUBLISH', ARGV[3], ARGV[6]) end
return {epoch, num(gf), num(now), version, reason, views, warnings,
        redis.call('HGETALL', KEYS[5])}
)lua";

// KEYS: members, held, version. ARGV: node, runs ("<b> <e> ..." of what
// the node keeps; '' for nothing), token, channel, message.
// Shrinks the node's record to the kept runs if it is recorded under
// `token` and covers them; nothing kept drops whatever is recorded.
constexpr char kReleaseScript[] = R"lua(
local e = wrong_type(KEYS[2], 'hash') or wrong_type(KEYS[3], 'string')
if e then return redis.error_reply(e) end
local cur = redis.call('HGET', KEYS[2], ARGV[1])
local keep = parse_runs(ARGV[2], false)
if not keep then return redis.error_reply('release: bad runs') end
if #keep == 0 then
  if cur then
    redis.call('HDEL', KEYS[2], ARGV[1])
    bump_version(KEYS[3])
    redis.call('PUBLISH', ARGV[4], ARGV[5])
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
redis.call('HSET', KEYS[2], ARGV[1], runs_text(keep) .. ' ' .. ct)
bump_version(KEYS[3])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 'OK'
)lua";

// KEYS: epoch, grants_from, run, version, members, held, token.
// ARGV: node, runs ("<b> <e> ..."), channel, epoch, message.
// Grants the runs if the state is still the epoch the caller polled, the
// node is live, grants are allowed, and no other live member holds any of
// it. Tokens only grow, also across a loss of Redis's state: each is at
// least the server time in microseconds. A grant announces nothing: nobody
// waits for one (growers wait for releases and leaves, which announce).
constexpr char kGrantScript[] = R"lua(
local now, t = now_ms()
for i = 1, 4 do
  local e = wrong_type(KEYS[i], 'string')
  if e then return redis.error_reply(e) end
end
local e = wrong_type(KEYS[5], 'zset') or wrong_type(KEYS[6], 'hash') or
          wrong_type(KEYS[7], 'string')
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
bump_version(KEYS[4])
return token
)lua";

// KEYS: epoch, grants_from, run, version, then members, held, token per
// kind. ARGV: channel, message, epoch, kinds, then per kind: kind,
// releases n, n x (node, kept runs "<b> <e> ..." ('' for none), token),
// grants m, m x (node, runs).
// Runs every release as kReleaseScript does, then every grant as
// kGrantScript does (each seeing the ones before it), and announces once
// if a release changed anything: "<message>\tf\t<kind>\t<b>-<e>,..." names
// the shards that became free. Returns one array per kind: a result per
// release, then per grant: 'OK', 'T <token>' or 'E <error>'.
constexpr char kHandoffScript[] = R"lua(
for i = 1, 4 do
  local e = wrong_type(KEYS[i], 'string')
  if e then return redis.error_reply(e) end
end
local nkinds = tonumber(ARGV[4])
for k = 1, nkinds do
  local b = 4 + 3 * (k - 1)
  local e = wrong_type(KEYS[b + 1], 'zset') or wrong_type(KEYS[b + 2], 'hash') or
            wrong_type(KEYS[b + 3], 'string')
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
  local b = 4 + 3 * (k - 1)
  local members, held, tokkey = KEYS[b + 1], KEYS[b + 2], KEYS[b + 3]
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
    -- of them: records outside the grants' hull cannot conflict, so only
    -- the others (and those that do not parse) need a liveness check.
    local function is_live(id)
      local sc = redis.call('ZSCORE', members, id)
      return sc ~= false and sc ~= nil and tonumber(sc) > now
    end
    local wants = {}
    local lo, hi = math.huge, -1
    for g = 0, ngr - 1 do
      local w = parse_runs(ARGV[ai + 2 * g + 1], false)
      if not w or #w == 0 then return redis.error_reply('handoff: bad runs') end
      wants[g + 1] = w
      lo = math.min(lo, w[1][1])
      hi = math.max(hi, w[#w][2])
    end
    local ranges = {}
    local h = redis.call('HGETALL', held)
    for i = 1, #h, 2 do
      local oruns = parse_held(h[i + 1])
      if not oruns then
        if is_live(h[i]) then ranges[h[i]] = quote(h[i + 1]) end
      elseif oruns[1][1] < hi and lo < oruns[#oruns][2] and is_live(h[i]) then
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
        redis.call('HSET', held, node, runs_text(want) .. ' ' .. token)
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
  -- look again; a plain message (poll) when that is unknown or too long.
  local msg = ARGV[2] .. '\tf' .. notice
  if unknown or #msg > 4000 then msg = ARGV[2] end
  redis.call('PUBLISH', ARGV[1], msg)
end
return out
)lua";

// KEYS: members, held, version. ARGV: channel, message, ids...
constexpr char kDeregisterScript[] = R"lua(
local e = wrong_type(KEYS[1], 'zset') or wrong_type(KEYS[2], 'hash') or
          wrong_type(KEYS[3], 'string')
if e then return redis.error_reply(e) end
for i = 3, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
end
bump_version(KEYS[3])
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 'OK'
)lua";

// KEYS: drained, version. ARGV: pod, '1' (drain) or '0' (undrain), channel,
// message.
// Records (or removes) the pod's drain flag, the server time in ms when it
// was drained; returns 'OK' after a change, 'UNCHANGED' when it was so.
constexpr char kDrainScript[] = R"lua(
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
constexpr char kKindsScript[] = R"lua(
local e = wrong_type(KEYS[1], 'hash')
if e then return redis.error_reply(e) end
return redis.call('HKEYS', KEYS[1])
)lua";

// KEYS: epoch, grants_from, run, version, drained, kinds, then members,
// held, token per kind.
// Reads everything at once and changes nothing: {epoch, grants_from, now,
// version, run_matches, drained, kinds, {members with scores, held, token}
// per kind}; a missing value is ''.
constexpr char kDescribeScript[] = R"lua(
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

// Describe reads at most this many kinds (the rest are named in a warning).
constexpr size_t kDescribeMaxKinds = 256;

std::string RandomEpoch() {
  std::random_device rd;
  return absl::StrCat(absl::Hex(rd(), absl::kZeroPad8),
                      absl::Hex(rd(), absl::kZeroPad8));
}

// Maps a script's error reply; `what` names the operation and ids.
absl::Status ScriptError(const std::string& what, const std::string& msg) {
  auto rest = [&](absl::string_view code) {
    return absl::StrCat(what, ": ", msg.substr(code.size() + 1));
  };
  if (absl::StartsWith(msg, "SETPOINT_ABORTED")) {
    return absl::AbortedError(rest("SETPOINT_ABORTED"));
  }
  if (absl::StartsWith(msg, "SETPOINT_PRECONDITION")) {
    return absl::FailedPreconditionError(rest("SETPOINT_PRECONDITION"));
  }
  if (absl::StartsWith(msg, "SETPOINT_NOT_MEMBER")) {
    return absl::FailedPreconditionError(rest("SETPOINT_NOT_MEMBER"));
  }
  if (absl::StartsWith(msg, "SETPOINT_GARBAGE")) {
    return absl::DataLossError(rest("SETPOINT_GARBAGE"));
  }
  return redis::StatusFromErrorReply(what, msg);
}

absl::Status CheckContext(const Context& ctx) { return ctx.Err(); }

}  // namespace

absl::Status ValidateRedisNodeRegistryOptions(
    const RedisNodeRegistryOptions& o) {
  auto invalid = [](const char* field, const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("redis registry options: ", field, " ", what));
  };
  if (absl::StatusOr<redis::RedisEndpoint> e =
          redis::ParseRedisAddress(o.address);
      !e.ok()) {
    return invalid("address", std::string(e.status().message()));
  }
  if (o.db < 0) return invalid("db", absl::StrCat("must be >= 0, got ", o.db));
  if (o.ns.empty()) return invalid("ns", "must not be empty");
  if (o.ns.find_first_of("{}") != std::string::npos) {
    return invalid("ns", "must not contain '{' or '}' (it is a hash tag)");
  }
  if (o.connect_timeout <= absl::ZeroDuration()) {
    return invalid("connect_timeout", "must be > 0");
  }
  if (o.command_timeout <= absl::ZeroDuration()) {
    return invalid("command_timeout", "must be > 0");
  }
  if (!o.username.empty() && o.password.empty()) {
    return invalid("username", "needs a password");
  }
  if (absl::Status s = ValidateBackoffOptions(o.reconnect_backoff); !s.ok()) {
    return invalid("reconnect_backoff", std::string(s.message()));
  }
  return absl::OkStatus();
}

struct RedisNodeRegistry::Impl {
  Impl(redis::RedisEndpoint endpoint, RedisNodeRegistryOptions o)
      : options(std::move(o)),
        logger(options.logger != nullptr ? options.logger
                                         : spdlog::default_logger()),
        prefix(absl::StrCat("{setpoint:", options.ns, "}")),
        channel(prefix + ":changed"),
        client(endpoint, options, logger),
        subscriber(endpoint, options, logger) {}

  std::string Key(const std::string& name) const {
    return absl::StrCat(prefix, ":", name);
  }
  std::string KindKey(const std::string& kind, const char* name) const {
    return absl::StrCat(prefix, ":kind:", kind, ":", name);
  }

  // Runs `script`, waiting at most until the context's deadline (and at
  // most command_timeout): a caller that must act by a deadline is never
  // held past it by a Redis that hangs.
  absl::StatusOr<RedisReply> Eval(const Context& ctx, RedisScript& script,
                                  const std::vector<std::string>& keys,
                                  const std::vector<std::string>& args,
                                  const std::string& what) {
    if (absl::Status s = CheckContext(ctx); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
    }
    absl::Duration budget = absl::InfiniteDuration();
    if (ctx.deadline() != absl::InfiniteFuture()) {
      budget = ctx.deadline() - ctx.clock()->Now();
      if (budget <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(
            absl::StrCat(what, ": no time left before the deadline"));
      }
    }
    MutexLock l(&mu);
    absl::StatusOr<RedisReply> reply = client.Eval(script, keys, args, budget);
    if (!reply.ok()) {
      return absl::Status(reply.status().code(),
                          absl::StrCat(what, ": ", reply.status().message()));
    }
    if (reply->type == RedisReply::Type::kError) {
      return ScriptError(what, reply->str);
    }
    return reply;
  }

  // Logs `line` at warning level, at most once per kWarnEvery for the same
  // line, with the number of repeats held back.
  void WarnLimited(const std::string& line) {
    absl::Time now = Clock::Monotonic()->Now();
    MutexLock l(&warn_mu);
    if (warned.size() > 256) warned.clear();
    auto [it, fresh] = warned.try_emplace(line, WarnState{now, 0});
    if (!fresh) {
      if (now - it->second.last < kWarnEvery) {
        ++it->second.held_back;
        return;
      }
      it->second.last = now;
    }
    int64_t repeats = it->second.held_back;
    it->second.held_back = 0;
    if (repeats > 0) {
      SPDLOG_LOGGER_WARN(logger,
                         "registry data refused prefix={} repeats={}: {}",
                         prefix, repeats, line);
    } else {
      SPDLOG_LOGGER_WARN(logger, "registry data refused prefix={}: {}", prefix,
                         line);
    }
  }

  void Subscribe(std::stop_token stop) {
    bool announced_loss = false;
    while (!stop.stop_requested()) {
      if (!subscriber.connected()) {
        absl::StatusOr<RedisReply> ack =
            subscriber.Command({"SUBSCRIBE", channel});
        if (!ack.ok() || ack->type == RedisReply::Type::kError) {
          subscriber.Disconnect();
          if (!announced_loss) {
            SPDLOG_LOGGER_DEBUG(logger,
                                "registry change channel unavailable, "
                                "polling only: {}",
                                ack.ok() ? ack->str : ack.status().ToString());
            announced_loss = true;
          }
          // The client's reconnect backoff paces the attempts; wait a
          // little so a refused connect does not spin.
          std::mutex m;
          std::condition_variable_any cv;
          std::unique_lock lock(m);
          cv.wait_for(lock, stop, std::chrono::milliseconds(100),
                      [] { return false; });
          continue;
        }
        announced_loss = false;
        Notify();  // Anything may have changed while we were away.
      }
      absl::StatusOr<RedisReply> msg =
          subscriber.ReadPushed(absl::Milliseconds(200));
      if (!msg.ok()) {
        subscriber.Disconnect();
        continue;
      }
      // A message is ["message", channel, payload]; the payload names the
      // registry that wrote it (our own writes need no nudge), and after
      // releases the shards they freed.
      if (msg->type == RedisReply::Type::kArray) {
        if (msg->elements.size() == 3) {
          std::optional<ChangeNotice> notice =
              redis::ParseChangeNotice(msg->elements[2].str, instance);
          if (notice.has_value()) Notify(*notice);
          continue;
        }
        Notify();
      }
    }
  }

  void Notify(const ChangeNotice& notice = ChangeNotice{}) {
    MutexLock l(&listeners_mu);
    for (auto& [id, listener] : listeners) listener(notice);
  }

  RedisNodeRegistryOptions options;
  std::shared_ptr<spdlog::logger> logger;
  const std::string prefix;
  const std::string channel;
  // Names this registry object in the change messages it publishes.
  const std::string instance = RandomEpoch();
  Mutex mu;
  RedisClient client ABSL_GUARDED_BY(mu);
  // The scripts are only touched inside Eval, under mu (the analysis cannot
  // follow them through the reference Eval takes).
  RedisScript poll{std::string(kPrelude) + kPollScript};
  RedisScript release{std::string(kPrelude) + kReleaseScript};
  RedisScript grant{std::string(kPrelude) + kGrantScript};
  RedisScript deregister{std::string(kPrelude) + kDeregisterScript};
  RedisScript handoff{std::string(kPrelude) + kHandoffScript};
  RedisScript drain{std::string(kPrelude) + kDrainScript};
  RedisScript kinds{std::string(kPrelude) + kKindsScript};
  RedisScript describe{std::string(kPrelude) + kDescribeScript};

  struct WarnState {
    absl::Time last;
    int64_t held_back;
  };
  static constexpr absl::Duration kWarnEvery = absl::Seconds(10);
  Mutex warn_mu;
  std::map<std::string, WarnState> warned ABSL_GUARDED_BY(warn_mu);

  // Subscriber thread only.
  RedisClient subscriber;
  Mutex listeners_mu;
  std::map<int64_t, std::function<void(const ChangeNotice&)>> listeners
      ABSL_GUARDED_BY(listeners_mu);
  int64_t next_listener ABSL_GUARDED_BY(listeners_mu) = 1;
  std::jthread thread ABSL_GUARDED_BY(listeners_mu);  // First listener.
};

absl::StatusOr<std::unique_ptr<RedisNodeRegistry>> RedisNodeRegistry::Create(
    RedisNodeRegistryOptions options) {
  if (absl::Status s = ValidateRedisNodeRegistryOptions(options); !s.ok()) {
    return s;
  }
  absl::StatusOr<redis::RedisEndpoint> endpoint =
      redis::ParseRedisAddress(options.address);
  if (!endpoint.ok()) return endpoint.status();
  return std::unique_ptr<RedisNodeRegistry>(new RedisNodeRegistry(
      std::make_unique<Impl>(*endpoint, std::move(options))));
}

RedisNodeRegistry::RedisNodeRegistry(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

RedisNodeRegistry::~RedisNodeRegistry() {
  if (impl_->thread.joinable()) {
    impl_->thread.request_stop();
    impl_->thread.join();
  }
}

absl::StatusOr<PollResult> RedisNodeRegistry::Poll(const Context& ctx,
                                                   const PollRequest& request) {
  if (request.lease < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("poll: lease must be >= 1ms, got ",
                     absl::FormatDuration(request.lease)));
  }
  Impl& d = *impl_;
  std::vector<std::string> keys = {
      d.Key("epoch"),   d.Key("grants_from"), d.Key("run"),    d.Key("version"),
      d.Key("drained"), d.Key("kinds"),       d.Key("clamped")};
  std::vector<std::string> args = {
      // A new id each time: the one written when a new epoch starts must
      // differ from every epoch anyone saw before.
      absl::StrCat(absl::ToInt64Milliseconds(request.lease)),
      RandomEpoch(),
      d.channel,
      absl::StrCat(request.kinds.size()),
      absl::StrCat(request.min_version),
      d.instance,
      request.own_held_only ? "1" : "0"};
  std::vector<std::string> kinds;
  for (const auto& [kind, ids] : request.kinds) {
    kinds.push_back(kind);
    keys.push_back(d.KindKey(kind, "members"));
    keys.push_back(d.KindKey(kind, "held"));
    keys.push_back(d.KindKey(kind, "token"));
    args.push_back(kind);
    auto ring = request.ring_sizes.find(kind);
    args.push_back(ring == request.ring_sizes.end()
                       ? std::string()
                       : absl::StrCat(ring->second));
    auto token = request.min_tokens.find(kind);
    args.push_back(token == request.min_tokens.end()
                       ? std::string()
                       : absl::StrCat(token->second));
    args.push_back(absl::StrCat(ids.size()));
    args.insert(args.end(), ids.begin(), ids.end());
  }
  // Errors are returned, not logged (the manager logs them, rate-limited).
  absl::StatusOr<RedisReply> reply = d.Eval(ctx, d.poll, keys, args, "poll");
  if (!reply.ok()) return reply.status();
  absl::StatusOr<redis::DecodedPoll> decoded =
      redis::DecodePollReply(*reply, kinds);
  if (!decoded.ok()) return decoded.status();
  for (const std::string& w : decoded->warnings) d.WarnLimited(w);
  if (!decoded->new_epoch_reason.empty()) {
    SPDLOG_LOGGER_INFO(d.logger,
                       "registry started a new epoch prefix={} "
                       "epoch={} version={}: {}",
                       d.prefix, decoded->result.epoch, decoded->result.version,
                       decoded->new_epoch_reason);
  }
  return std::move(decoded->result);
}

absl::Status RedisNodeRegistry::Release(const Context& ctx,
                                        const std::string& kind,
                                        const std::string& node_id,
                                        Assignment keep) {
  Impl& d = *impl_;
  if (keep.range.Empty()) keep = Assignment{};
  absl::StatusOr<RedisReply> reply = d.Eval(
      ctx, d.release,
      {d.KindKey(kind, "members"), d.KindKey(kind, "held"), d.Key("version")},
      {node_id, redis::RunsArg(keep.range), absl::StrCat(keep.token), d.channel,
       d.instance},
      absl::StrCat("release node=", node_id, " range=", keep.range.ToString(),
                   " token=", keep.token));
  return reply.status();
}

absl::StatusOr<uint64_t> RedisNodeRegistry::Grant(const Context& ctx,
                                                  const std::string& kind,
                                                  const std::string& node_id,
                                                  ShardSet set,
                                                  const std::string& epoch) {
  const std::string what =
      absl::StrCat("grant node=", node_id, " range=", set.ToString());
  if (set.Empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": empty range"));
  }
  Impl& d = *impl_;
  absl::StatusOr<RedisReply> reply = d.Eval(
      ctx, d.grant,
      {d.Key("epoch"), d.Key("grants_from"), d.Key("run"), d.Key("version"),
       d.KindKey(kind, "members"), d.KindKey(kind, "held"),
       d.KindKey(kind, "token")},
      {node_id, redis::RunsArg(set), d.channel, epoch, d.instance}, what);
  if (!reply.ok()) return reply.status();
  absl::StatusOr<uint64_t> token = redis::ParseToken(reply->str);
  if (!token.ok()) {
    return absl::InternalError(
        absl::StrCat(what, ": the script returned ", token.status().message()));
  }
  return *token;
}

absl::StatusOr<HandoffResult> RedisNodeRegistry::Handoff(
    const Context& ctx, const HandoffRequest& request) {
  Impl& d = *impl_;
  HandoffResult out;
  out.releases.resize(request.releases.size());
  out.grants.resize(request.grants.size());
  // Per kind, the indices of its operations (the script groups by kind).
  struct Ops {
    std::vector<size_t> releases, grants;
  };
  std::map<std::string, Ops> by_kind;
  for (size_t i = 0; i < request.releases.size(); ++i) {
    by_kind[request.releases[i].kind].releases.push_back(i);
  }
  for (size_t i = 0; i < request.grants.size(); ++i) {
    const HandoffRequest::GrantOp& g = request.grants[i];
    if (g.target.Empty()) {
      out.grants[i] = absl::InvalidArgumentError(
          absl::StrCat("grant node=", g.node_id, " range=", g.target.ToString(),
                       ": empty range"));
      continue;
    }
    by_kind[g.kind].grants.push_back(i);
  }
  if (by_kind.empty()) return out;
  std::vector<std::string> keys = {d.Key("epoch"), d.Key("grants_from"),
                                   d.Key("run"), d.Key("version")};
  std::vector<std::string> args = {d.channel, d.instance, request.epoch,
                                   absl::StrCat(by_kind.size())};
  for (const auto& [kind, ops] : by_kind) {
    keys.push_back(d.KindKey(kind, "members"));
    keys.push_back(d.KindKey(kind, "held"));
    keys.push_back(d.KindKey(kind, "token"));
    args.push_back(kind);
    args.push_back(absl::StrCat(ops.releases.size()));
    for (size_t i : ops.releases) {
      Assignment keep = request.releases[i].keep;
      if (keep.range.Empty()) keep = Assignment{};
      args.push_back(request.releases[i].node_id);
      args.push_back(redis::RunsArg(keep.range));
      args.push_back(absl::StrCat(keep.token));
    }
    args.push_back(absl::StrCat(ops.grants.size()));
    for (size_t i : ops.grants) {
      args.push_back(request.grants[i].node_id);
      args.push_back(redis::RunsArg(request.grants[i].target));
    }
  }
  absl::StatusOr<RedisReply> reply =
      d.Eval(ctx, d.handoff, keys, args,
             absl::StrCat("handoff releases=", request.releases.size(),
                          " grants=", request.grants.size()));
  if (!reply.ok()) return reply.status();
  auto malformed = [](const std::string& why) {
    return absl::InternalError(
        absl::StrCat("handoff: the script returned ", why));
  };
  if (reply->type != RedisReply::Type::kArray ||
      reply->elements.size() != by_kind.size()) {
    return malformed("a reply of another shape");
  }
  size_t k = 0;
  for (const auto& [kind, ops] : by_kind) {
    const RedisReply& per = reply->elements[k++];
    if (per.type != RedisReply::Type::kArray ||
        per.elements.size() != ops.releases.size() + ops.grants.size()) {
      return malformed(
          absl::StrCat("a reply of another shape for kind ", kind));
    }
    for (size_t j = 0; j < per.elements.size(); ++j) {
      const std::string& r = per.elements[j].str;
      const bool is_release = j < ops.releases.size();
      std::string what;
      if (is_release) {
        const HandoffRequest::ReleaseOp& op = request.releases[ops.releases[j]];
        what = absl::StrCat("release node=", op.node_id,
                            " range=", op.keep.range.ToString(),
                            " token=", op.keep.token);
      } else {
        const HandoffRequest::GrantOp& op =
            request.grants[ops.grants[j - ops.releases.size()]];
        what = absl::StrCat("grant node=", op.node_id,
                            " range=", op.target.ToString());
      }
      absl::StatusOr<uint64_t> result = uint64_t{0};
      if (absl::StartsWith(r, "E ")) {
        result = ScriptError(what, r.substr(2));
      } else if (is_release && r != "OK") {
        return malformed(absl::StrCat("\"", r.substr(0, 64), "\" for ", what));
      } else if (!is_release) {
        if (!absl::StartsWith(r, "T ")) {
          return malformed(
              absl::StrCat("\"", r.substr(0, 64), "\" for ", what));
        }
        result = redis::ParseToken(r.substr(2));
        if (!result.ok()) {
          return malformed(
              absl::StrCat(result.status().message(), " for ", what));
        }
      }
      if (is_release) {
        out.releases[ops.releases[j]] = result.status();
      } else {
        out.grants[ops.grants[j - ops.releases.size()]] = std::move(result);
      }
    }
  }
  return out;
}

absl::Status RedisNodeRegistry::Deregister(
    const Context& ctx, const std::string& kind,
    const std::vector<std::string>& node_ids) {
  Impl& d = *impl_;
  std::vector<std::string> args = {d.channel, d.instance};
  args.insert(args.end(), node_ids.begin(), node_ids.end());
  return d
      .Eval(ctx, d.deregister,
            {d.KindKey(kind, "members"), d.KindKey(kind, "held"),
             d.Key("version")},
            args, absl::StrCat("deregister kind=", kind))
      .status();
}

absl::Status RedisNodeRegistry::SetDrained(const Context& ctx,
                                           const std::string& pod_id,
                                           bool drained) {
  const std::string what =
      absl::StrCat(drained ? "drain" : "undrain", " pod=", pod_id);
  if (absl::Status s = ValidatePodId(pod_id); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
  }
  Impl& d = *impl_;
  return d
      .Eval(ctx, d.drain, {d.Key("drained"), d.Key("version")},
            {pod_id, drained ? "1" : "0", d.channel, d.instance}, what)
      .status();
}

absl::StatusOr<RegistryDescription> RedisNodeRegistry::Describe(
    const Context& ctx) {
  Impl& d = *impl_;
  // Two round trips: the kinds name the keys the second one reads at once.
  absl::StatusOr<RedisReply> names =
      d.Eval(ctx, d.kinds, {d.Key("kinds")}, {}, "describe");
  if (!names.ok()) return names.status();
  std::vector<std::string> kinds;
  std::vector<std::string> warnings;
  if (names->type == RedisReply::Type::kArray) {
    for (const RedisReply& name : names->elements) kinds.push_back(name.str);
  }
  std::sort(kinds.begin(), kinds.end());
  if (kinds.size() > kDescribeMaxKinds) {
    warnings.push_back(absl::StrCat("key ", d.Key("kinds"), " names ",
                                    kinds.size(), " kinds; only the first ",
                                    kDescribeMaxKinds, " are described"));
    kinds.resize(kDescribeMaxKinds);
  }
  std::vector<std::string> keys = {d.Key("epoch"),   d.Key("grants_from"),
                                   d.Key("run"),     d.Key("version"),
                                   d.Key("drained"), d.Key("kinds")};
  for (const std::string& kind : kinds) {
    keys.push_back(d.KindKey(kind, "members"));
    keys.push_back(d.KindKey(kind, "held"));
    keys.push_back(d.KindKey(kind, "token"));
  }
  absl::StatusOr<RedisReply> reply =
      d.Eval(ctx, d.describe, keys, {}, "describe");
  if (!reply.ok()) return reply.status();
  absl::StatusOr<RegistryDescription> out =
      redis::DecodeDescribeReply(*reply, kinds);
  if (!out.ok()) return out.status();
  for (std::string& w : out->warnings) {
    w = absl::StrCat(d.prefix, ": ", w);
  }
  out->warnings.insert(out->warnings.begin(), warnings.begin(), warnings.end());
  return out;
}

int64_t RedisNodeRegistry::AddChangeListener(std::function<void()> listener) {
  return AddNoticeListener(
      [listener = std::move(listener)](const ChangeNotice&) { listener(); });
}

int64_t RedisNodeRegistry::AddNoticeListener(
    std::function<void(const ChangeNotice&)> listener) {
  Impl& d = *impl_;
  MutexLock l(&d.listeners_mu);
  int64_t id = d.next_listener++;
  d.listeners.emplace(id, std::move(listener));
  if (!d.thread.joinable()) {
    d.thread = std::jthread([&d](std::stop_token stop) {
      pthread_setname_np(pthread_self(), "sp-registry-sub");
      d.Subscribe(stop);
    });
  }
  return id;
}

void RedisNodeRegistry::RemoveChangeListener(int64_t id) {
  MutexLock l(&impl_->listeners_mu);
  impl_->listeners.erase(id);
}

int64_t RedisNodeRegistry::round_trips() const {
  MutexLock l(&impl_->mu);
  return impl_->client.round_trips();
}

const std::string& RedisNodeRegistry::prefix() const { return impl_->prefix; }

}  // namespace setpoint
