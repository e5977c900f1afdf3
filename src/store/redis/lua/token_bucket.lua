-- token_bucket.lua: the twin of src/algorithm/token_bucket.cc.
--
-- State: the string "tokens_ticks last_us"; no key is a full bucket (the
-- C++ kNeverUsed). tokens_ticks <= capacity < 2^51, last_us < 2^53.

local token_bucket = {params = bucket_params}

local function tb_load(key)
  local s = call('GET', key)
  if not s then return nil end
  local tokens, last = split3(s)
  return {tokens = tokens, last = last}
end

local function tb_fresh_at(b, st)
  return st.last + ceildiv(b.cap - st.tokens, b.per_us)
end

function token_bucket.decide(b, key, ctx, cost)
  local now = ctx.now
  local st = tb_load(key)
  local tokens, last = b.cap, now
  if st then
    -- Lazy refill. A clock that went back refills nothing and keeps `last`.
    tokens = min(b.cap, st.tokens + ticks_in(b, now - st.last))
    last = max(st.last, now)
  end
  local d, consumed, used_after = bucket_decide(b, b.cap - tokens, cost)
  measure_from_now(d, last - now)
  if consumed then return d, {tokens = b.cap - used_after, last = last} end
  return d, nil
end

function token_bucket.save(b, key, st, ctx)
  store_string(key, fmt2(st.tokens, st.last), tb_fresh_at(b, st), ctx, b)
end

function token_bucket.refund(b, key, ctx, taken_at, cost)
  local st = tb_load(key)
  if not st then return end
  if cost > 0 then st.tokens = min(b.cap, st.tokens + min(cost, b.burst) * b.per_token) end
  token_bucket.save(b, key, st, ctx)
end
