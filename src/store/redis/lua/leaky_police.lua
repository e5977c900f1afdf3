-- leaky_police.lua: the twin of leaky_bucket mode police
-- (src/algorithm/leaky_bucket.cc).
--
-- State: the string "level_ticks last_us"; no key is an empty bucket
-- (level 0 at time 0).

local leaky_police = {params = bucket_params}

local function lp_load(key)
  local s = call('GET', key)
  if not s then return nil end
  local level, last = split3(s)
  return {level = level, last = last}
end

function leaky_police.decide(b, key, ctx, cost)
  local now = ctx.now
  local st = lp_load(key) or {level = 0, last = 0}
  -- The level leaks while time passes; a clock that went back leaks nothing.
  local level = max(0, st.level - ticks_in(b, now - st.last))
  local d, consumed, used_after = bucket_decide(b, level, cost)
  measure_from_now(d, st.last - now)
  if consumed then return d, {level = used_after, last = max(st.last, now)} end
  return d, nil
end

function leaky_police.save(b, key, st, ctx)
  store_string(key, fmt2(st.level, st.last), st.last + ceildiv(st.level, b.per_us), ctx, b)
end

function leaky_police.refund(b, key, ctx, taken_at, cost)
  local st = lp_load(key)
  if not st then return end
  if cost > 0 then st.level = max(0, st.level - min(cost, b.burst) * b.per_token) end
  leaky_police.save(b, key, st, ctx)
end
