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
