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

-- `floor_ticks` (op L, a leased slice of `cost` slots): see bucket_lease;
-- tokens may then go below zero, by the slots beyond the capacity.
function token_bucket.decide(b, key, ctx, cost, reuse, floor_ticks)
  local now = ctx.now
  local st_tokens, st_last = tb_load(key)
  local tokens, last = b.cap, now
  if st_tokens then
    -- Lazy refill. A clock that went back refills nothing and keeps `last`.
    tokens = min(b.cap, st_tokens + ticks_in(b, now - st_last))
    last = max(st_last, now)
  end
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

function token_bucket.save(b, key, st, ctx)
  store_string(key, fmt2(st.tokens, st.last), tb_fresh_at(b, st), ctx, b)
end

function token_bucket.refund(b, key, ctx, taken_at, cost)
  local tokens, last = tb_load(key)
  if not tokens then return end
  if cost > 0 then tokens = min(b.cap, tokens + min(cost, b.burst) * b.per_token) end
  token_bucket.save(b, key, {tokens = tokens, last = last}, ctx)
end
