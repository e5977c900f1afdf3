-- gcra.lua: the twin of src/algorithm/gcra.cc.
--
-- State: the theoretical arrival time (TAT), in ticks, as "us" or "us rem"
-- (TAT = us * ticks_per_us + rem, see split_ticks); no key is TAT 0. The
-- C++ word now_us * ticks_per_us reaches 2^62; here only distances from now
-- are formed, and those below 2^52. A TAT further ahead than that (the
-- clock went far back) is handled by bucket_decide_far.

local gcra = {params = bucket_params, leases = true}  -- op L

local gcra_plan = {}

-- `floor_ticks` (op L, a leased slice of `cost` slots): see bucket_lease.
function gcra.decide(b, key, ctx, cost, reuse, floor_ticks)
  local now = ctx.now
  local tat_us, tat_rem = split_ticks(call('GET', key) or nil)
  local used = ticks_after(b.per_us, now, tat_us, tat_rem)
  if used == nil then return bucket_decide_far(b, tat_us - now, tat_rem, cost), nil end
  local d, consumed, used_after
  if floor_ticks then
    d, consumed, used_after = bucket_lease(b, used, cost, floor_ticks)
  else
    d, consumed, used_after = bucket_decide(b, used, cost)
  end
  if consumed then
    local plan = reuse and gcra_plan or {}
    plan.us, plan.rem = ticks_from(b.per_us, now, used_after)
    return d, plan
  end
  return d, nil
end

-- A request of `cost` to an empty key (a full bucket) at `now`, as
-- fixed_window.empty: its TAT, now plus its ticks.
function gcra.empty(b, now, cost)
  if cost > b.burst then return false end
  local per_us = b.per_us
  local after = cost * b.per_token
  local allowed, remaining, reset = bucket_fast(0, after, b.cap, per_us, b.per_token)
  if allowed ~= 1 then return false end
  local r = after % per_us
  local us = now + (after - r) / per_us
  if r == 0 then return fmt(us), expiry_of(b, us), remaining, reset end
  return fmt2(us, r), expiry_of(b, us + 1), remaining, reset
end

-- The common case of decide and save, without tables or helper calls (a
-- decision's arithmetic in Lua costs more than its GET and SET): a TAT
-- within 2^52 ticks of now, no debt, a cost within the burst, decided from
-- the key's state `s` as the driver read it (false: none). Returns
-- allowed, limit, remaining, reset_after, retry_after and delay, having
-- written the state when `writes` and it took something; or nothing,
-- having written nothing, where decide is to decide. The same answers and
-- the same state as decide and save (the parity tests run both).
function gcra.fast(b, key, ctx, cost, writes, s)
  local burst, per_us, per_token, cap = b.burst, b.per_us, b.per_token, b.cap
  if cost > burst then return end
  local now, used = ctx.now, 0
  if s then
    local us, rem
    local space = find(s, ' ', 1, true)
    if space then
      us, rem = tonum(sub(s, 1, space - 1)), tonum(sub(s, space + 1))
    else
      us, rem = tonum(s), 0
    end
    if us == nil or rem == nil or rem < 0 then return end
    local D = us - now
    if D >= 0 then
      if D * per_us > TWO52 then return end
      used = D * per_us + rem
    end
    if used > cap then return end
  end
  local allowed, remaining, reset, retry, after =
      bucket_fast(used, cost * per_token, cap, per_us, per_token)
  if allowed == 1 and writes and cost > 0 then
    local r = after % per_us
    if r < 0 then r = r + per_us end
    local us = now + (after - r) / per_us
    if r == 0 then
      store_fresh(key, fmt(us), us, ctx, b)
    else
      store_fresh(key, fmt2(us, r), us + 1, ctx, b)
    end
  end
  return allowed, burst, remaining, reset, retry, 0
end

function gcra.save(b, key, st, ctx)
  store_string(key, format_ticks(st.us, st.rem), ceil_ticks(st.us, st.rem), ctx, b)
end

function gcra.charge(b, key, ctx, cost)
  if cost <= 0 then return end
  local now = ctx.now
  local tat_us, tat_rem = split_ticks(call('GET', key) or nil)
  local used = charged_used(b, ticks_after(b.per_us, now, tat_us, tat_rem), cost)
  if used == nil then return end  -- too far ahead to form: kept as it is
  local us, rem = ticks_from(b.per_us, now, used)
  gcra.save(b, key, {us = us, rem = rem}, ctx)
end

function gcra.refund(b, key, ctx, taken_at, cost)
  local s = call('GET', key)
  if not s then return end
  local us, rem = split_ticks(s)
  if cost > 0 then
    local q
    q, rem = floordiv(rem - min(cost, b.burst) * b.per_token, b.per_us)
    us = us + q
  end
  gcra.save(b, key, {us = us, rem = rem}, ctx)
end
