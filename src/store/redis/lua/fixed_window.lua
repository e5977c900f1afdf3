-- fixed_window.lua: the twin of fixed_window (src/algorithm/window.cc).
--
-- State: the string "window count" (window = floor(now_us / period_us));
-- no key is an empty window.

local fixed_window = {}

fixed_window.params = window_params

local function fw_load(key)
  local s = redis.call('GET', key)
  if not s then return {window = 0, count = 0}, false end
  local window, count = split3(s)
  return {window = window, count = count}, true
end

function fixed_window.decide(w, key, ctx, cost)
  local now = ctx.now
  local st = fw_load(key)
  -- A clock that went back stays in the latest window seen.
  local window = max(floordiv(now, w.period), st.window)
  local count = (window == st.window) and st.count or 0
  local until_end = (window + 1) * w.period - now
  local d = decision(w.limit)
  local used = count
  if cost > w.limit then
    d.retry = INFINITE
  elseif count + cost <= w.limit then
    d.allowed = 1
    used = count + cost
  else
    d.retry = until_end
  end
  d.remaining = w.limit - used
  d.reset = (used > 0) and until_end or 0
  if d.allowed == 1 and cost > 0 then return d, {window = window, count = used} end
  return d, nil
end

function fixed_window.save(w, key, st, ctx)
  local fresh_at = nil
  if st.count > 0 then fresh_at = (st.window + 1) * w.period end
  store_string(key, fmt(st.window) .. ' ' .. fmt(st.count), fresh_at, ctx)
end

function fixed_window.refund(w, key, ctx, taken_at, cost)
  local st, found = fw_load(key)
  if not found then return end
  if st.window == floordiv(taken_at, w.period) then
    st.count = max(0, st.count - cost)
  end
  fixed_window.save(w, key, st, ctx)
end
