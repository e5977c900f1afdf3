-- common.lua: exact integer helpers shared by the algorithm twins.
--
-- Lua 5.1 numbers are doubles: integers are exact below 2^53, and every
-- value the algorithms keep stays below that bound (ValidateForRedis in
-- script.cc rejects configs that would not). What doubles do NOT give for
-- free is exact division: a / b is rounded, so floor(a / b) can be one
-- off when the quotient is just below an integer. floordiv corrects it with
-- the remainder, which is exact. Never format a number with tostring() or
-- `..`: Lua prints 14 significant digits, and epoch microseconds have 16;
-- fmt() prints every digit.
--
-- All helpers are locals: Redis forbids scripts to create globals.
--
-- Redis runs a library's top level with only `redis` in reach; math, string
-- and the rest are there when its function runs. The ones the hot paths use
-- become upvalues on the first call (bind_globals): a global is a table
-- lookup on every use, and a call decides many requests.
local floor, format, find, sub, match, tonum, call

local function bind_globals()
  floor, format, find, sub, match, tonum = math.floor, string.format, string.find, string.sub,
                                           string.match, tonumber
  call = redis.call
end

local TWO52 = 4503599627370496
local INFINITE = -1  -- retry_after that never comes, as the reply encodes it

-- floor(a / b) and a - floor(a / b) * b, exact for 0 < b < 2^53 and
-- 0 <= a < 2^53 or |a| < 2^52 (below -2^52, floor(a / b) * b may pass 2^53).
-- Lua's a % b is a - floor(a / b) * b in doubles: the product is exact (it
-- is within b of a), and floor(a / b) is exact unless a / b rounded up onto
-- the next integer, which leaves a remainder in (-b, 0), corrected here.
-- (a - r) is then a multiple of b, and its quotient exact. No call of
-- math.floor: this runs several times a decision. The window algorithms'
-- fast and INCRBY paths write out floordiv(now, period) instead of calling
-- it or a helper of theirs: a Lua call there costs about 600 instructions a
-- decision, more than the arithmetic (bench/README.md, "A window's count in
-- one integer").
local function floordiv(a, b)
  local r = a % b
  if r < 0 then r = r + b end
  return (a - r) / b, r
end

-- a / b rounded up, 0 for a <= 0 (the C++ CeilDiv).
local function ceildiv(a, b)
  if a <= 0 then return 0 end
  return floordiv(a - 1, b) + 1
end

-- a / b rounded up for any sign of a.
local function ceildiv_signed(a, b)
  local q = floordiv(-a, b)
  return -q
end

-- floor(a * b / c) and the remainder, for 0 <= a, b < 2^53, 0 < c <= 2^50,
-- when the quotient is below 2^53. When a * b itself is exact (< 2^53) it is
-- one division; otherwise long multiplication in base 2^k digits of `a`,
-- keeping the running value as quotient * c + remainder with every partial
-- sum below 2^53 (the 128-bit products of the C++, in doubles).
local function muldiv(a, b, c)
  if a * b < 2 * TWO52 then return floordiv(a * b, c) end
  local bq, br = floordiv(b, c)
  local base = 2
  while c * base * 4 <= 2 * TWO52 do base = base * 2 end
  local digits = {}
  local rest = a
  while rest > 0 do
    local d
    rest, d = floordiv(rest, base)
    digits[#digits + 1] = d
  end
  local q, r = 0, 0
  for i = #digits, 1, -1 do
    -- (q * c + r) * base + digit * br, with r * base + digit * br < 2 * base * c
    local tq, tr = floordiv(r * base + digits[i] * br, c)
    q = q * base + tq
    r = tr
  end
  return a * bq + q, r
end

local function max(a, b) if a > b then return a end return b end
local function min(a, b) if a < b then return a end return b end

-- Every digit of an integral number (%d formats through a C long).
local function fmt(x)
  return format('%d', x)
end

-- "a b" (and "a b c") with every digit, in one formatting.
local function fmt2(a, b)
  return format('%d %d', a, b)
end
local function fmt3(a, b, c)
  return format('%d %d %d', a, b, c)
end

-- The text of a count 0 <= n < 256, formatted once: a %d costs about
-- 2,300 instructions (string.format), a kept text a table read. Beyond,
-- fmt. COUNT_OF is the other way, the count of each text kept: a fast path
-- reading a state's count takes `COUNT_OF[text] or tonum(text)`, a table
-- read where tonumber costs about 1,300 instructions (Lua 5.1's tonumber
-- runs strtod twice on a string). No more than 256: with 4,096 counts
-- kept a call of one decision cost Redis about 6,000 instructions more, in
-- the garbage collection it steps every 50 calls; with 256 about 1,400
-- (bench/redis/call_costs.sh).
local COUNT_TEXTS, COUNT_OF, MAX_COUNT_TEXT = {}, {}, 256
local function count_text(n)
  if n >= 0 and n < MAX_COUNT_TEXT then
    local t = COUNT_TEXTS[n]
    if t == nil then
      t = fmt(n)
      COUNT_TEXTS[n], COUNT_OF[t] = t, n
    end
    return t
  end
  return fmt(n)
end

-- The text of window `index` of a limit, kept in `keep` (the limit's
-- parameters) while the keys it decides are in that window. A fast path
-- reading a state's window compares its text with keep.window_text first:
-- the same text is the window keep.window_index, without a tonumber.
local function window_text(keep, index)
  if keep.window_index ~= index then keep.window_index, keep.window_text = index, fmt(index) end
  return keep.window_text
end

-- A decimal integer argument; errors name the argument.
local function int_arg(s, what)
  local n = tonum(s)
  if n == nil or n ~= floor(n) or n >= 2 * TWO52 or n <= -2 * TWO52 then
    error('sluice: ' .. what .. ' is not an integer below 2^53: "' .. tostring(s) .. '"')
  end
  return n
end

-- The two space-separated integers of a stored state ("a b"), or nil when
-- it is not that; cheaper than a pattern.
local function split2(s)
  local space = find(s, ' ', 1, true)
  if space == nil then return nil end
  return tonum(sub(s, 1, space - 1)), tonum(sub(s, space + 1))
end

-- The space-separated integers of a stored state (one to three); an error
-- when a field is not a number. Plain finds, not a pattern: a pattern
-- match costs more than the rest of a decision's arithmetic.
local function split3(s)
  local i = find(s, ' ', 1, true)
  if i == nil then
    local a = tonum(s)
    if a == nil then error('sluice: malformed state "' .. s .. '"') end
    return a
  end
  local a, b, c = tonum(sub(s, 1, i - 1)), nil, nil
  local j = find(s, ' ', i + 1, true)
  if j == nil then
    b = tonum(sub(s, i + 1))
  else
    b, c = tonum(sub(s, i + 1, j - 1)), tonum(sub(s, j + 1))
    if c == nil then error('sluice: malformed state "' .. s .. '"') end
  end
  if a == nil or b == nil then error('sluice: malformed state "' .. s .. '"') end
  return a, b, c
end

-- The PXAT text of `fresh_at` (see store_string), kept in `keep`.
local function expiry_of(keep, fresh_at)
  if keep.expiry_us ~= fresh_at then
    local ms = ceildiv(fresh_at, 1000)
    if keep.expiry_ms ~= ms then keep.expiry_ms, keep.expiry_text = ms, fmt(ms) end
    keep.expiry_us = fresh_at
  end
  return keep.expiry_text
end

-- Writes a string state that is fresh at `fresh_at`, after now, expiring
-- when it becomes fresh: PXAT the millisecond after it (rounded up, so
-- never early; an absolute time, from the same TIME as `now`). With a
-- caller-given time (`ctx.timed` false) the expiry cannot be related to
-- Redis' own clock, so the key keeps no expiry. `keep` (a limit's
-- parameters) keeps the last expiry's text: the keys of a call (one `now`)
-- often expire in the same millisecond, formatted once.
local function store_fresh(key, value, fresh_at, ctx, keep)
  if ctx.timed then
    call('SET', key, value, 'PXAT', expiry_of(keep, fresh_at))
  else
    call('SET', key, value)
  end
end

-- How the driver reads a key for a fast path (driver.lua, run_parts).
-- Where a limit's keys have lately been found empty more often than not
-- (the first request of a key, or of its next window once the last one's
-- key expired), it reads the key with the write of the state an empty key
-- takes (SET ... NX GET, the algorithm's `empty`): one command where the
-- key is empty, whose answer is then known without the fast path, and
-- where it holds a state, the state unchanged and answered, as by GET.
-- Where they have lately held states, it reads with GET, the cheaper
-- command for that. `keep.fresh` (a limit's parameters) counts between -8
-- and 8, one up for a key found empty and one down for a key found with a
-- state; at 0 or more the keys are taken to be empty (`keep.fresh >= 0`).
-- Either read gives the same decision: the fast path decides from the
-- state read (`s`, false for an empty key: a nil reply).

-- A fixed window's keys (fixed_window.replaced) are read with a write that
-- replaces the window before's state as well as an empty key: found
-- holding this window's state, such a read costs Redis a second command
-- and a number read from text. So there a key found holding this window's
-- state counts HELD_WEIGHT down, and the keys are taken to be empty while
-- fewer than about 1 in HELD_WEIGHT + 1 hold one.
local HELD_WEIGHT = 3

-- The window fast paths store a count raised within its window with
-- `SET ... KEEPTTL` (its integer form: INCRBY, which keeps it too): the key was written in that window at Redis' time
-- with an expiry this state calls for (every write of a window state sets
-- one: when it is fresh, plus how long a window's key is kept, below), so
-- neither the expiry's text nor Redis' two updates of its expiry table
-- (removed, then set again) are spent on it. A call at a given time (no
-- expiry) writes as store_fresh does.

-- Stores a string state until `fresh_at`, and `kept_for` longer (a
-- window's key, below; nil: no longer): deleted when already fresh.
local function store_string(key, value, fresh_at, ctx, keep, kept_for)
  if fresh_at == nil or fresh_at <= ctx.now then
    call('DEL', key)
  else
    store_fresh(key, value, fresh_at + (kept_for or 0), ctx, keep)
  end
end

-- How long a window's key (fixed_window, sliding_window) is kept after
-- its state is fresh: the time into the window at which it is written,
-- `now` mod the period, at most one period. Every key of a window is
-- fresh at the same instant; were they all to expire then, Redis would
-- delete them all at once, in active expiry cycles of up to 25 ms during
-- which it answers no one (its latency monitor's `expire-cycle`). So they
-- expire over a period, in the order they were written, never before they
-- are fresh (a state kept longer than it counts is read as the window it
-- is of). The fast paths write it out as `now + period` (fixed_window) and
-- `now + 2 * period` (sliding_window): fresh at the window's end, or the
-- next one's, plus now - start.

-- The integer form of a window's state (store.redis.window_state: integer;
-- fixed_window.lua, sliding_window.lua): a number below 2^53 whose low 8
-- bits are its window's tag, window % 255 + 1 (1 to 255), and whose bits
-- above hold the counts. A window's key lives at most two periods past its
-- window's end (a sliding window's count weighs on the next window), so of
-- the windows with a key's tag, the one nearest now is the key's own.
local function window_tag(window) return window % 255 + 1 end

-- The window whose tag `v` holds, the one nearest `ref`, and v's bits
-- above its tag; nil when `v` is no such number.
local function tagged_window(v, ref)
  if v == nil or v < 0 or v % 1 ~= 0 then return nil end
  local r = v % 256
  if r == 0 then return nil end
  local d = (r - window_tag(ref)) % 255
  if d > 127 then d = d - 255 end
  return ref + d, (v - r) / 256
end

-- The text of the integer state `v`, kept in `keep` (a limit's parameters:
-- `texts`, `texts_n`) for up to TEXTS_KEPT states: a window's keys take
-- few states (a new key's, or one carrying the window before's few
-- requests), and a %d costs Redis about 2,300 instructions where a kept
-- text is a table read. A full table starts over (each window's states
-- are new: their tag moves). Few: a Redis may serve many limits, and
-- kept texts have cost every call (COUNT_TEXTS above). 8 and 32 measured
-- alike (bench/README.md, "Numbers as text").
local TEXTS_KEPT = 8
local function tagged_text(keep, v)
  local texts = keep.texts
  local s = texts[v]
  if s == nil then
    s = fmt(v)
    local n = keep.texts_n
    if n >= TEXTS_KEPT then
      texts, n = {}, 0
      keep.texts = texts
    end
    texts[v] = s
    keep.texts_n = n + 1
  end
  return s
end

-- The text of an INCRBY's step for a window limit `w`, kept in `w` while
-- the step is the same (see below).
local function step_text_of(w, step)
  if w.step ~= step then w.step, w.step_text = step, fmt(step) end
  return w.step_text
end

-- The table a window limit `w` keeps for its INCRBY runs (incr_run in
-- fixed_window.lua and sliding_window.lua: what a run's requests share),
-- with the text of the run's INCRBY step.
local function incr_run_of(w, step)
  local rc = w.run
  if rc == nil then
    rc = {w = w}
    w.run = rc
  end
  rc.step_s = step_text_of(w, step)
  return rc
end

-- Numbers a command takes again and again go as kept text: given a Lua
-- number, redis.call formats it with snprintf's %.17g (Redis 7.0's
-- luaArgsToRedisArgv), about 2,000 instructions a command (callgrind); a
-- string goes as it is. The window incr paths keep their INCRBY's step as
-- text in the limit's parameters (`step`, `step_text`: the last step and
-- its text). A number computed afresh costs about as much through fmt.

-- A window algorithm's `empty` (fixed_window.empty): a key fresh `kept`
-- windows on, kept now - start longer (above), whose state is
-- "window<middle>cost".
local function window_empty(w, now, cost, kept, middle)
  local limit, period = w.limit, w.period
  if cost > limit then return false end
  local index = floordiv(now, period)
  local ends = (index + kept) * period
  return window_text(w, index) .. middle .. count_text(cost), expiry_of(w, now + kept * period),
         limit - cost, ends - now
end

-- {limit, period} (period in microseconds): the parameters LimitParams()
-- sends for the window algorithms.
local function window_params(argv, i)
  return {limit = int_arg(argv[i + 1], 'limit'), period = int_arg(argv[i + 2], 'period_us'),
          fresh = 0, texts = {}, texts_n = 0}
end

-- A Decision as the reply lists it. One table serves every decision: the
-- driver copies a limit's decision into the reply before it asks the next
-- limit, so no two are alive at once (a table a decision would cost more
-- than some algorithms' arithmetic).
local the_decision = {}
local function decision(limit)
  local d = the_decision
  d.allowed, d.limit, d.remaining, d.reset, d.retry, d.delay = 0, limit, 0, 0, 0, 0
  return d
end

-- ---- the bucket arithmetic (src/algorithm/bucket_math.h) ----
--
-- token_bucket, gcra and leaky_bucket police reduce their state to `used`,
-- the ticks of capacity in use at now, and decide from it here.
-- b: {per_us, per_token, burst, cap, fill_us}; cap = burst * per_token.

-- The group of parameters LimitParams() sends for a bucket limit.
local function bucket_params(argv, i)
  return {per_us = int_arg(argv[i + 1], 'ticks_per_us'),
          per_token = int_arg(argv[i + 2], 'ticks_per_token'),
          burst = int_arg(argv[i + 3], 'burst'),
          cap = int_arg(argv[i + 4], 'capacity_ticks'),
          fill_us = int_arg(argv[i + 5], 'fill_us'),
          fresh = 0}
end

-- Ticks that refill (or leak) in `us` microseconds, saturating at cap + 1.
local function ticks_in(b, us)
  if us <= 0 then return 0 end
  if us > b.fill_us then return b.cap + 1 end
  return us * b.per_us
end

-- The most ticks a charge may leave in use: the capacity and a debt of at
-- most 1024 capacities (kMaxDebtLimits), and at most 2^52 ticks of debt.
local function max_used(b)
  return b.cap + min(b.cap * 1024, TWO52)
end

-- Cost units left with `used` ticks in use: below zero by a debt, down to
-- the most debt max_used allows (the C++ Remaining).
local function bucket_remaining(b, used)
  if used <= b.cap then return (floordiv(b.cap - used, b.per_token)) end
  -- Formed as a debt below 2^52, not as b.cap - used: the capacity may be
  -- past 2^53, where a double's sum is no longer exact. Past 2^52 whole
  -- microseconds' ticks (as bucket_decide_far), the most debt.
  local most = min(b.cap * 1024, TWO52)
  if used - used % b.per_us > TWO52 then return -ceildiv(most, b.per_token) end
  return -ceildiv(min(used - b.cap, most), b.per_token)
end

-- Returns the Decision, whether the state takes `used_after`, and used_after.
-- `used` >= 0, below 2^53 (callers handle larger ones, see gcra).
local function bucket_decide(b, used, cost)
  local d = decision(b.burst)
  if cost > b.burst then
    d.retry = INFINITE
    d.remaining = bucket_remaining(b, used)
    d.reset = ceildiv(used, b.per_us)
    return d, false, used
  end
  local cost_ticks = cost * b.per_token
  if used <= b.cap - cost_ticks then
    local used_after = used + cost_ticks
    d.allowed = 1
    d.remaining = floordiv(b.cap - used_after, b.per_token)
    d.reset = ceildiv(used_after, b.per_us)
    return d, cost > 0, used_after
  end
  d.remaining = bucket_remaining(b, used)
  d.reset = ceildiv(used, b.per_us)
  d.retry = ceildiv(used - (b.cap - cost_ticks), b.per_us)
  return d, false, used
end

-- bucket_decide for the fast paths (gcra.fast, token_bucket.fast): `used`
-- within the capacity, a cost within the burst; locals only, no decision
-- table. Returns allowed (0/1), remaining, reset_after, retry_after and the
-- ticks in use after the decision.
local function bucket_fast(used, cost_ticks, cap, per_us, per_token)
  local after, retry = used, 0
  if used <= cap - cost_ticks then
    after = used + cost_ticks
  else
    local over = used - (cap - cost_ticks)  -- > 0
    local r = (over - 1) % per_us
    if r < 0 then r = r + per_us end
    retry = (over - 1 - r) / per_us + 1
  end
  local r = (cap - after) % per_token
  if r < 0 then r = r + per_token end
  local remaining = (cap - after - r) / per_token
  local reset = 0
  if after > 0 then
    r = (after - 1) % per_us
    if r < 0 then r = r + per_us end
    reset = (after - 1 - r) / per_us + 1
  end
  return (retry == 0) and 1 or 0, remaining, reset, retry, after
end

-- ---- debt (op G, a charge whether or not it fits: src/algorithm/bucket_math.h) ----

-- `used` after a charge of `cost` whether or not it fits, up to max_used;
-- a `used` far ahead already (above 2^52, or nil: too far to form) stays.
local function charged_used(b, used, cost)
  if used == nil or cost <= 0 then return used end
  local top = max_used(b)
  if used >= top or used > TWO52 then return used end
  if cost > floordiv(top - used, b.per_token) then return top end
  return used + cost * b.per_token
end

-- The most a window algorithm's count may reach with debt: the limit and
-- 1024 limits more, repaid within 2^51 us (the C++ MaxWindowCount).
local function max_window_count(w)
  return w.limit * (1 + min(1024, floordiv(TWO52 / 2, w.period)))
end

-- The windows `count` spans until it is spent: what is over the limit is
-- carried into the next window and repaid at the limit per window.
local function windows_spanned(count, limit)
  if count <= 0 then return 0 end
  return floordiv(count - 1, limit) + 1
end

-- op L, a leased slice of gcra or token_bucket (docs/distributed.md,
-- "Leased limits"): `used` raised to `floor_ticks` (the lead), then `n`
-- slots granted when the first of them fits now; the others lie beyond the
-- capacity, each spendable once the bucket has drained to it. The decision's
-- reset is then the last slot's end, its retry (denied) the wait for one.
local function bucket_lease(b, used, n, floor_ticks)
  if used < floor_ticks then used = floor_ticks end
  if n > b.burst then return bucket_decide(b, used, n) end  -- never
  local d, fits = bucket_decide(b, used, 1)
  if not fits then return d, false, used end
  local used_after = used + n * b.per_token
  d.remaining = max(0, floordiv(b.cap - used_after, b.per_token))
  d.reset = ceildiv(used_after, b.per_us)
  return d, true, used_after
end

-- The same decision when `used` = D * per_us + rem is too large to form
-- (D > 2^52 / per_us: only after the clock went far back, gcra and shape).
-- It is then far above the capacity, so the request is denied; the
-- durations are computed from D and rem without forming `used`.
local function bucket_decide_far(b, D, rem, cost)
  local d = decision(b.burst)
  d.remaining = -ceildiv(min(b.cap * 1024, TWO52), b.per_token)  -- the most debt
  d.reset = D + ((rem > 0) and 1 or 0)
  if cost > b.burst then
    d.retry = INFINITE
  else
    d.retry = D + ceildiv_signed(rem - (b.cap - cost * b.per_token), b.per_us)
  end
  return d
end

-- token_bucket and leaky_bucket police decide as of `last` when the clock is
-- behind it: their durations are `lag` longer from now.
local function measure_from_now(d, lag)
  if lag <= 0 then return end
  if d.reset > 0 then d.reset = d.reset + lag end
  if d.allowed == 0 and d.retry ~= INFINITE then d.retry = d.retry + lag end
end

-- A time in ticks, now_us * per_us + rem, kept as (us, rem) with
-- 0 <= rem < per_us: gcra and leaky shape count absolute time in ticks, up to
-- 2^62 in the C++, which a double cannot hold. `us` is the time floored to a
-- microsecond, so `us` alone says which side of now a tick time lies on.
local function split_ticks(s)
  if s == nil then return 0, 0 end
  local us, rem = split3(s)
  return us, rem or 0
end

local function format_ticks(us, rem)
  if rem == 0 then return fmt(us) end  -- an integer: Redis stores it in 8 bytes
  return fmt2(us, rem)
end

-- Ticks from now to a tick time (us, rem): (D, rem) with D = us - now; the
-- distance is max(0, D * per_us + rem), formed only when it is below 2^52.
-- Returns the distance (or nil when too large to form).
local function ticks_after(per_us, now, us, rem)
  local D = us - now
  if D < 0 then return 0 end
  if D * per_us > TWO52 then return nil end
  return D * per_us + rem
end

-- (us, rem) of now + ticks, for 0 <= ticks < 2^53.
local function ticks_from(per_us, now, ticks)
  local q, r = floordiv(ticks, per_us)
  return now + q, r
end

-- When a tick time is reached, rounded up to a microsecond (the C++
-- CeilDiv(ticks, per_us): 0 when ticks <= 0).
local function ceil_ticks(us, rem)
  if us < 0 or (us == 0 and rem == 0) then return 0 end
  return us + ((rem > 0) and 1 or 0)
end
