-- token_bucket.lua: the twin of src/algorithm/token_bucket.cc.
--
-- State: the string "tokens_ticks last_us"; no key is a full bucket (the
-- C++ kNeverUsed). tokens_ticks <= capacity < 2^51, last_us < 2^53.

local token_bucket = {params = bucket_params, leases = true}  -- op L

-- tokens_ticks, last_us; nil when there is no key.
local function tb_load(key)
  local s = call('GET', key)
  if not s then return nil end
  return split3(s)
end

local tb_plan = {}

local function tb_fresh_at(b, st)
  return st.last + ceildiv(b.cap - st.tokens, b.per_us)
end

-- The tokens at `now` (lazy refill) and the time they are counted at. A
-- clock that went back refills nothing and keeps `last`. Tokens below zero
-- (a lease's slots, or debt: op G) refill at the rate like any missing one.
local function tb_refilled(b, st_tokens, st_last, now)
  if not st_tokens then return b.cap, now end
  local gap = now - st_last
  local refill = ticks_in(b, gap)
  if st_tokens < 0 and gap > 0 then
    local need = b.cap - st_tokens
    if gap > floordiv(need, b.per_us) then refill = need else refill = gap * b.per_us end
  end
  return min(b.cap, st_tokens + refill), max(st_last, now)
end

-- `floor_ticks` (op L, a leased slice of `cost` slots): see bucket_lease;
-- tokens may then go below zero, by the slots beyond the capacity.
function token_bucket.decide(b, key, ctx, cost, reuse, floor_ticks)
  local now = ctx.now
  local st_tokens, st_last = tb_load(key)
  local tokens, last = tb_refilled(b, st_tokens, st_last, now)
  local d, consumed, used_after
  if floor_ticks then
    d, consumed, used_after = bucket_lease(b, b.cap - tokens, cost, floor_ticks)
  else
    d, consumed, used_after = bucket_decide(b, b.cap - tokens, cost)
  end
  measure_from_now(d, last - now)
  if consumed then
    local plan = reuse and tb_plan or {}
    plan.tokens, plan.last = b.cap - used_after, last
    return d, plan
  end
  return d, nil
end

-- A request of `cost` to an empty key (a full bucket) at `now`, as
-- fixed_window.empty: the tokens left, counted at now.
function token_bucket.empty(b, now, cost)
  if cost > b.burst then return false end
  local allowed, remaining, reset, _, after =
      bucket_fast(0, cost * b.per_token, b.cap, b.per_us, b.per_token)
  if allowed ~= 1 then return false end
  return fmt2(b.cap - after, now), expiry_of(b, now + reset), remaining, reset
end

-- The common case of decide and save, as gcra.fast: tokens not below zero,
-- counted at or before now, a cost within the burst.
function token_bucket.fast(b, key, ctx, cost, writes, s)
  local burst, per_us, per_token, cap = b.burst, b.per_us, b.per_token, b.cap
  if cost > burst then return end
  local now, used = ctx.now, 0
  if s then
    local space = find(s, ' ', 1, true)
    if space == nil then return end
    local tokens, last = tonum(sub(s, 1, space - 1)), tonum(sub(s, space + 1))
    if tokens == nil or last == nil or tokens < 0 or last > now then return end
    local gap = now - last
    if gap <= b.fill_us then
      tokens = tokens + gap * per_us
      if tokens < cap then used = cap - tokens end
    end
  end
  local allowed, remaining, reset, retry, after =
      bucket_fast(used, cost * per_token, cap, per_us, per_token)
  if allowed == 1 and writes and cost > 0 then
    store_fresh(key, fmt2(cap - after, now), now + reset, ctx, b)
  end
  return allowed, burst, remaining, reset, retry, 0
end

function token_bucket.save(b, key, st, ctx)
  store_string(key, fmt2(st.tokens, st.last), tb_fresh_at(b, st), ctx, b)
end

function token_bucket.charge(b, key, ctx, cost)
  if cost <= 0 then return end
  local st_tokens, st_last = tb_load(key)
  local tokens, last = tb_refilled(b, st_tokens, st_last, ctx.now)
  local used = charged_used(b, b.cap - tokens, cost)
  token_bucket.save(b, key, {tokens = b.cap - used, last = last}, ctx)
end

function token_bucket.refund(b, key, ctx, taken_at, cost)
  local tokens, last = tb_load(key)
  if not tokens then return end
  if cost > 0 then tokens = min(b.cap, tokens + min(cost, b.burst) * b.per_token) end
  token_bucket.save(b, key, {tokens = tokens, last = last}, ctx)
end
