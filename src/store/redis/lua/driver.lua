-- driver.lua: the function's entry point. Decides, checks or refunds a
-- batch of requests in order, each over the limits of one policy, one KEY
-- per limit, all-or-nothing within a request, each with its own answer.
--
--   FCALL sluice_<id> numkeys key... part...
--   part: op now_us cost taken_at_us n limit_1 ... limit_n
--     or, for one limit at Redis' time (most requests): d|c cost limit_1
--     or g such parts alike, one after the other: * g d|c cost limit_1
--
-- A part takes the next n keys (the short form: one; a run of g short
-- parts: g, one each, answered as g parts). Fewer arguments are less for
-- Redis to read and turn into Lua strings, per request. limit_i is the limit's parameters as one
-- string, "code p1 p2 ..." (LimitParams in script.cc); a library keeps the
-- parsed form of the strings it has seen, so a call parses none it knows.
-- op "D": decide every limit on the current state without writing; only if
-- all allow are the new states written (a denial anywhere takes nothing
-- anywhere, as Limiter::AcquireAt's decide-refund-check does).
-- op "C": the same decisions, never written.
-- op "R": gives `cost` taken at taken_at_us back to every limit but a
-- leaky_bucket shape one, whose departure slot is kept.
-- op "N": R of `cost` taken at taken_at_us, then D, in one step (a
-- concurrency limit's lease renewed: its slot is never lost to another).
-- D, R and N may name a concurrency limit's slots: taken_at_us is then
-- "taken_at_us:slot" (D: "0:slot"), slot a number in decimal digits. D
-- holds the slots under that name, R gives back the slots of that name
-- alone (none if none are held), and N renews them under it, or, none
-- being held, is denied and takes nothing.
-- op "G": `cost` charged to every limit whether or not it fits (a settled
-- cost above its estimate): what is over the limit is debt. Answered like R.
-- op "L": a leased slice of one gcra or token_bucket limit: D of `cost`
-- deciding as if at least taken_at_us (the lead) of the bucket were used,
-- so its slots lie at least that far ahead of now.
-- now_us "": Redis' own clock (TIME, read once per call), what every
-- production call sends, so that instances with skewed clocks agree; a
-- decimal time is used instead (the parity tests replay times), and then
-- keys get no expiry, since that time is not Redis' clock.
--
-- Reply, part after part: the part's now_us followed, for D, C, L and N, by six
-- integers per limit: allowed (0/1), limit, remaining, reset_after_us,
-- retry_after_us (-1: never), delay_us. A short part (d, c) answers three:
-- code, remaining, reset_after_us, where code is 2 x delay_us (even, >= 0)
-- when allowed and -2 - retry_after_us when denied (-1: never), its limit's
-- own limit being known to the caller (EncodePart keeps it); or one
-- element: false (a nil reply) when its answer is that of the short part
-- just before it (a run's keys found empty answer alike), or the odd
-- 2 x remaining + 1 when it is allowed with no delay and the reset_after of
-- the short part just before it (a window's run: incr_keys). A call with
-- short parts ends with its now_us, theirs. A part that fails (a key
-- holding another type, a malformed state) is one error string instead;
-- the parts before and after it are decided as usual.

local ALGORITHMS = {
  tb = load_token_bucket(), gc = load_gcra(), lp = load_leaky_police(), ls = load_leaky_shape(),
  fw = load_fixed_window(), sl = load_sliding_log(), sw = load_sliding_window(),
}
ALGORITHMS.cc = ALGORITHMS.sl.concurrency

-- Texts of a call parsed once and kept between calls (a library's locals
-- live as long as the library): parse(s) runs only for a text not kept.
-- Bounded: a full table starts over. Limit strings, costs ("1" nearly
-- always) and a run's length (tonumber costs Redis about 1,300
-- instructions; a kept text is one table lookup).
local MAX_KEPT = 4096

local function parsed_once(parse)
  local kept, count = {}, 0
  return function(s)
    local v = kept[s]
    if v ~= nil then return v end
    v = parse(s)
    if count >= MAX_KEPT then kept, count = {}, 0 end
    kept[s] = v
    count = count + 1
    return v
  end
end

local limit_of = parsed_once(function(s)
  local p = {}
  for word in string.gmatch(s, '%S+') do p[#p + 1] = word end
  local algo = ALGORITHMS[p[1]]
  if algo == nil then error('sluice: unknown algorithm code "' .. tostring(p[1]) .. '"') end
  return {algo = algo, params = algo.params(p, 1)}
end)

local cost_of = parsed_once(function(s)
  local c = int_arg(s, 'cost')
  if c < 0 then error('sluice: cost must not be negative') end
  return c
end)

-- A run's length, false where it is not a whole number of at least 1.
local run_length_of = parsed_once(function(s)
  local g = tonum(s)
  if g == nil or g < 1 or g ~= floor(g) then return false end
  return g
end)

-- An algorithm's decide(params, key, ctx, cost, reuse) returns the decision
-- and, when it would write, the plan its save writes. With `reuse` the plan
-- may be the algorithm's one scratch table (no table made per decision):
-- only where it is saved before the next decide (one limit per part); a
-- part of several limits keeps every plan until all have decided.

-- One limit's decision by the algorithm's decide (written when `writes`
-- and it takes something): allowed, limit, remaining, reset_after,
-- retry_after, delay.
local function decide_general(algo, params, key, ctx, cost, writes)
  local d, plan = algo.decide(params, key, ctx, cost, true)
  if writes and plan and d.allowed == 1 then algo.save(params, key, plan, ctx) end
  return d.allowed, d.limit, d.remaining, d.reset, d.retry, d.delay
end

-- The same, by the algorithm's fast path where it has one (gcra,
-- token_bucket, fixed_window, sliding_window) and the case is common, the
-- key read with GET.
local function decide_one(algo, params, key, ctx, cost, writes)
  local fast = algo.fast
  if fast then
    local allowed, limit, remaining, reset, retry, delay =
        fast(params, key, ctx, cost, writes, call('GET', key))
    if allowed then return allowed, limit, remaining, reset, retry, delay end
  end
  return decide_general(algo, params, key, ctx, cost, writes)
end

-- The reply, kept from call to call (a table made and grown afresh costs
-- Redis about as much per element as converting it), and its length: the
-- elements after reply_n are an earlier call's, and the first of them is
-- made nil before the reply is returned (Redis reads up to the first nil).
local the_reply, reply_n = {}, 0

-- One part: keys[k .. k+n-1], limit strings args[a .. a+n-1]. Appends its
-- answer to `reply` after its first reply_n elements, and counts them in
-- reply_n (a failure midway leaves elements the caller drops).
local function run_part(op, ctx, cost, taken_at, keys, k, args, a, n, reply)
  local lost = false
  if op == 'N' then
    -- A renewed lease: what was taken at taken_at goes back, then D, with
    -- no other call between (a concurrency limit keeps its slot). Named
    -- slots no longer held are lost: the part is denied, taking nothing.
    for i = 0, n - 1 do
      local l = limit_of(args[a + i])
      if l.algo.refund then
        local found = l.algo.refund(l.params, keys[k + i], ctx, taken_at, cost)
        if ctx.slot and l.params.named and not found then lost = true end
      end
    end
    op = lost and 'C' or 'D'
  end
  if op == 'G' then
    -- Settled costs: `cost` charged whether or not it fits (debt); limits
    -- that carry none are left alone, as the C++ ChargeInPlace does.
    for i = 0, n - 1 do
      local l = limit_of(args[a + i])
      if l.algo.charge then l.algo.charge(l.params, keys[k + i], ctx, cost) end
    end
    reply_n = reply_n + 1
    reply[reply_n] = ctx.now
    return
  end
  if op == 'R' then
    for i = 0, n - 1 do
      local l = limit_of(args[a + i])
      if l.algo.refund then l.algo.refund(l.params, keys[k + i], ctx, taken_at, cost) end
    end
    reply_n = reply_n + 1
    reply[reply_n] = ctx.now
    return
  end
  if op == 'L' then
    -- A leased slice of a bucket: a decision of `cost` whose slots start at
    -- least `taken_at` (the lead, microseconds) ahead (docs/redis-scripts.md).
    local l = limit_of(args[a])
    if n ~= 1 or not l.algo.leases then error('sluice: op L takes one gcra or token_bucket limit') end
    local b = l.params
    local d, plan = l.algo.decide(b, keys[k], ctx, cost, true, min(taken_at, b.fill_us) * b.per_us)
    local m = reply_n + 1
    reply[m] = ctx.now
    reply[m + 1], reply[m + 2], reply[m + 3] = d.allowed, d.limit, d.remaining
    reply[m + 4], reply[m + 5], reply[m + 6] = d.reset, d.retry, d.delay
    reply_n = m + 6
    if plan and d.allowed == 1 then l.algo.save(b, keys[k], plan, ctx) end
    return
  end
  local m = reply_n + 1
  reply[m] = ctx.now
  if n == 1 then  -- the common case, without the tables of the general one
    local l = limit_of(args[a])
    reply[m + 1], reply[m + 2], reply[m + 3], reply[m + 4], reply[m + 5], reply[m + 6] =
        decide_one(l.algo, l.params, keys[k], ctx, cost, op == 'D')
    if lost then reply[m + 1] = 0 end
    reply_n = m + 6
    return
  end
  local limits, plans = {}, {}
  local all_allowed = true
  for i = 0, n - 1 do
    local l = limit_of(args[a + i])
    local d, plan = l.algo.decide(l.params, keys[k + i], ctx, cost)
    limits[i], plans[i] = l, plan
    if d.allowed == 0 then all_allowed = false end
    local at = m + 6 * i
    if lost then d.allowed = 0 end
    reply[at + 1], reply[at + 2], reply[at + 3] = d.allowed, d.limit, d.remaining
    reply[at + 4], reply[at + 5], reply[at + 6] = d.reset, d.retry, d.delay
  end
  reply_n = m + 6 * n
  if op == 'D' and all_allowed then
    for i = 0, n - 1 do
      if plans[i] then limits[i].algo.save(limits[i].params, keys[k + i], plans[i], ctx) end
    end
  end
end

-- An error of a part: a message (error()) or Redis' error table (a
-- failing redis.call, such as WRONGTYPE).
local function error_text(e)
  if type(e) == 'table' then e = e.err end
  return tostring(e)
end

local PART_ARGS = 5  -- op now_us cost taken_at_us n, before the limits

-- Where run_parts is: the part it runs (its first key and argument, the
-- part's index within a run, and the reply's length before it) and the part
-- after it. A part that fails leaves them for decide() to resume after it.
local at_key, at_arg, at_run, reply_before, next_key, next_arg, next_run
-- While an algorithm's incr_keys decides a run's requests: its `rc` (where
-- it is: rc.at_j, rc.at_m), the run's first key and first argument. And
-- the request of a run whose key an INCRBY could not raise (get_at): it is
-- read with GET when the run resumes (decide).
local incr_run, incr_run_k, incr_run_a, get_at
-- The call's context at Redis' time (TIME read once per call), in a table
-- kept from call to call (timed_ctx).
local call_ctx
local timed_ctx = {timed = true, now = 0}
-- A call whose arguments do not form parts fails as a whole.
local malformed
-- Whether the call has short parts: its reply then ends with its time.
local short_parts

-- TIME's seconds, as text and in microseconds, kept from the call before:
-- most calls fall in its second, and their seconds need no tonumber.
local time_s, time_s_us

local function time_ctx()
  local ctx = call_ctx
  if ctx == nil then
    local t = call('TIME')
    local s = t[1]
    if s ~= time_s then time_s, time_s_us = s, tonum(s) * 1000000 end
    ctx = timed_ctx
    ctx.now = time_s_us + tonum(t[2])
    call_ctx = ctx
  end
  return ctx
end

local function malformed_part(a)
  malformed = 'sluice: a part needs its arguments, then one limit and one key per limit; ' ..
              'the part at argument ' .. a .. ' does not have them'
end

-- Runs the parts from (at_key, at_arg) to the last, each appending its
-- answer to `reply`. Parts at Redis' time in the short form (one limit, the
-- common case) run here without the tables and calls of the general form.
local function run_parts(keys, args, nargs, nkeys, reply)
  while at_arg <= nargs do
    local a, k = at_arg, at_key
    local op = args[a]
    local g, ops  -- a run of g short parts, its arguments from ops
    if op == 'd' or op == 'c' then
      g, ops = 1, a
    elseif op == '*' then
      g, ops = run_length_of(args[a + 1]), a + 2
      op = args[ops]
      if not g or (op ~= 'd' and op ~= 'c') then
        malformed_part(a)
        return
      end
    end
    if g then
      -- Short parts at Redis' time, one limit and one key each.
      short_parts = true
      if ops + 2 > nargs or k + g - 1 > nkeys then
        malformed_part(a)
        return
      end
      local after = ops + 3
      -- Before each part j: where its answer starts (reply_before) and where
      -- to resume should it fail (next_*: the run's next part, or the part
      -- after the run). The run's time, cost and limit are read once, as
      -- the part at_run's: should one fail, that part answers the error and
      -- the run resumes at the next, which reads them again (and fails
      -- alone too).
      reply_before, next_key, next_arg, next_run = reply_n, k, a, at_run + 1
      if at_run + 1 == g then next_key, next_arg, next_run = k + g, after, 0 end
      local ctx = time_ctx()
      ctx.slot = nil
      local cost = cost_of(args[ops + 1])
      local l = limit_of(args[ops + 2])
      local algo, params, writes = l.algo, l.params, op == 'd'
      local fast = algo.fast
      -- Where the limit's keys are taken to be empty (common.lua, "How the
      -- driver reads a key"), a key is read with the write of the state
      -- an empty key takes (algo.empty), which with the answer it gives is
      -- the same for every key of the run: made once, at its first use.
      local empty = writes and cost > 0 and algo.empty
      -- The algorithm's incr (fixed_window, sliding_window), for a limit in
      -- the integer form, and what the run's requests share in it (rc).
      local incr = writes and cost > 0 and params.integer and algo.incr_keys
      local rc = incr and algo.incr_run(params, ctx, cost)
      if not rc then incr = nil end
      -- Where the algorithm can tell what a fresh key's write replaced
      -- (fixed_window.replaced), a key is read with a write that replaces
      -- a state of the window before as well as an empty key (no NX).
      local replaced = rc and algo.replaced
      -- What a key found holding a state counts (below): more than one
      -- found empty where replacing costs more than reading (HELD_WEIGHT).
      local held = replaced and HELD_WEIGHT or 1
      local e_state, e_expiry, e_remaining, e_reset
      local read_at = get_at  -- a request INCRBY could not decide, or nil
      get_at = nil
      -- Whether the part before, in this loop, was a key found empty: the
      -- answer of another is then one element, false (the same again).
      local after_empty = false
      local m = reply_before
      local j = at_run
      while j < g do
        if incr and params.fresh < 0 and j ~= read_at then
          -- Its keys taken to hold states: decided by INCRBY, one loop in
          -- the algorithm for as long as it can (fixed_window.incr_keys),
          -- which says where it is in `rc` should its INCRBY fail.
          incr_run, incr_run_k, incr_run_a = rc, k, a
          local from = j
          j, m = incr(rc, keys, k, j, g, reply, m)
          incr_run = nil
          if j > from then after_empty = false end
          if j >= g then break end
          -- Else the key at j is one INCRBY could not decide, as it was, read
          -- with GET below; or keys are now found empty, and it is read with
          -- its write.
        end
        reply_before, next_run = m, j + 1
        if next_run == g then next_key, next_arg, next_run = k + g, after, 0 end
        -- decide_one written out: one Lua call fewer a decision, about 700
        -- instructions in Redis (callgrind).
        local key = keys[k + j]
        -- The key's state, read with the write of an empty key's where the
        -- limit's keys are taken to be empty, else with GET.
        local s, with_write
        if empty and params.fresh >= 0 then
          if e_state == nil then
            e_state, e_expiry, e_remaining, e_reset = empty(params, ctx.now, cost)
          end
          with_write = e_state  -- (false: such a request might not fit)
        end
        local allowed, lim, r, t, y, w  -- limit, remaining, reset, retry, delay
        local code  -- the short answer's, where `replaced` made it
        if with_write and replaced then
          s = call('SET', key, e_state, 'PXAT', e_expiry, 'GET')
          if s then
            code, r, t = replaced(rc, key, s)
            if code == nil then s = false end  -- spent: as an empty key
          end
        elseif with_write then
          s = call('SET', key, e_state, 'PXAT', e_expiry, 'NX', 'GET')
        elseif fast then
          s = call('GET', key)
        end
        if empty then
          -- How its keys were found (common.lua, "How the driver reads a key").
          local fresh = params.fresh
          if s then
            fresh = fresh - held
            if fresh < -8 then fresh = -8 end
            params.fresh = fresh
          elseif fresh < 8 then
            params.fresh = fresh + 1
          end
        end
        local found_empty = with_write and not s
        if code then
          reply[m + 1], reply[m + 2], reply[m + 3] = code, r, t
          m = m + 3
          after_empty = false
        elseif found_empty then
          if after_empty then
            m = m + 1
            reply[m] = false
          else
            reply[m + 1], reply[m + 2], reply[m + 3] = 0, e_remaining, e_reset
            m = m + 3
            after_empty = true
          end
        else
          if fast then allowed, lim, r, t, y, w = fast(params, key, ctx, cost, writes, s) end
          if allowed == nil then
            allowed, lim, r, t, y, w = decide_general(algo, params, key, ctx, cost, writes)
          end
          -- The short answer: allowed, retry and delay in one integer (an
          -- allowed decision never has a retry, a denial never a delay).
          if allowed == 1 then
            if y ~= 0 then error('sluice: an allowed decision with a retry_after') end
            code = 2 * w  -- even: a delay below 2^51 (ValidateForRedis)
          else
            if w ~= 0 then error('sluice: a denial with a delay') end
            code = -y - 2
          end
          reply[m + 1], reply[m + 2], reply[m + 3] = code, r, t
          m = m + 3
          after_empty = false
        end
        j = j + 1
      end
      reply_n = m
      at_key, at_arg, at_run = k + g, after, 0
    elseif op == 'D' or op == 'C' or op == 'R' or op == 'L' or op == 'N' or op == 'G' then
      local n, first = tonum(args[a + 4]), a + PART_ARGS
      if n == nil or n < 1 or n ~= floor(n) or first + n - 1 > nargs or k + n - 1 > nkeys then
        malformed_part(a)
        return
      end
      reply_before, next_key, next_arg, next_run = reply_n, k + n, first + n, 0
      local now_s = args[a + 1]
      local ctx
      if now_s == '' then
        ctx = time_ctx()
      else
        ctx = {timed = false, now = int_arg(now_s, 'now_us')}
      end
      local cost = cost_of(args[a + 2])
      -- taken_at_us, or "taken_at_us:slot" (D: "0:slot"), a concurrency
      -- limit's slots named by the slot's digits.
      local taken_s, slot = args[a + 3], nil
      local colon = find(taken_s, ':', 1, true)
      if colon then
        taken_s, slot = sub(taken_s, 1, colon - 1), sub(taken_s, colon + 1)
        if not find(slot, '^%d+$') then error('sluice: a slot is digits, got "' .. slot .. '"') end
      end
      ctx.slot = slot
      local taken_at = 0
      if op == 'R' or op == 'L' or op == 'N' then taken_at = int_arg(taken_s, 'taken_at_us') end
      run_part(op, ctx, cost, taken_at, keys, k, args, first, n, reply)
      at_key, at_arg = next_key, next_arg
    else
      malformed = 'sluice: op must be D, C, R, L, N, G, d, c or *, got "' .. tostring(op) .. '"'
      return
    end
  end
end

local function decide(keys, args)
  if floor == nil then bind_globals() end
  local reply = the_reply
  reply_n = 0
  local nargs, nkeys = #args, #keys
  if nargs == 0 then error('sluice: a call with no part') end
  at_key, at_arg, at_run, call_ctx, malformed, short_parts = 1, 1, 0, nil, nil, false
  incr_run, get_at = nil, nil
  -- One protected run for the whole call; a part that fails (an error()
  -- or a failing redis.call) is answered with its message, and the run
  -- resumes at the part after it.
  while true do
    local ok, e = pcall(run_parts, keys, args, nargs, nkeys, reply)
    if malformed then error(malformed) end
    if ok then break end
    if incr_run then
      -- incr_keys failed at its request at_j: that request's INCRBY did, on
      -- a key that holds no integer state (a text one, or another type),
      -- left as it was. (The commands after an INCRBY write the key it
      -- raised and do not fail; were anything else to fail there, the
      -- request would be counted twice, never let through for free.) The
      -- run resumes at that request, its key read with GET, as one INCRBY
      -- cannot decide; should that fail too, the request answers the error.
      reply_n = incr_run.at_m
      at_key, at_arg, at_run, get_at = incr_run_k, incr_run_a, incr_run.at_j, incr_run.at_j
      incr_run = nil
    else
      reply_n = reply_before + 1
      reply[reply_n] = error_text(e)
      at_key, at_arg, at_run = next_key, next_arg, next_run
    end
  end
  if at_key - 1 ~= nkeys then
    error('sluice: ' .. nkeys .. ' keys for parts that name ' .. (at_key - 1))
  end
  if short_parts then
    reply_n = reply_n + 1
    reply[reply_n] = call_ctx and call_ctx.now or 0
  end
  reply[reply_n + 1] = nil
  return reply
end

redis.register_function('SLUICE_FUNCTION_NAME', decide)
-- Envoy's quota service across instances (quota.lua).
redis.register_function('SLUICE_FUNCTION_NAME_quota', load_quota().claim)
