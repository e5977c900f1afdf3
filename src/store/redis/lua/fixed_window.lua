-- fixed_window.lua: the twin of fixed_window (src/algorithm/window.cc).
--
-- State: the string "window count" (window = floor(now_us / period_us));
-- no key is an empty window.

local fixed_window = {}

fixed_window.params = window_params

-- window, count and whether the key exists.
local function fw_load(key)
  local s = call('GET', key)
  if not s then return 0, 0, false end
  local window, count = split2(s)
  if count == nil then error('sluice: malformed state "' .. s .. '"') end
  return window, count, true
end

local fw_plan = {}

function fixed_window.decide(w, key, ctx, cost, reuse)
  local now = ctx.now
  local st_window, st_count = fw_load(key)
  -- A clock that went back stays in the latest window seen.
  local window = max(floordiv(now, w.period), st_window)
  local count = (window == st_window) and st_count or 0
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
  if d.allowed == 1 and cost > 0 then
    local plan = reuse and fw_plan or {}
    plan.window, plan.count = window, used
    return d, plan
  end
  return d, nil
end

function fixed_window.save(w, key, st, ctx)
  local fresh_at = nil
  if st.count > 0 then fresh_at = (st.window + 1) * w.period end
  store_string(key, fmt2(st.window, st.count), fresh_at, ctx, w)
end

function fixed_window.refund(w, key, ctx, taken_at, cost)
  local window, count, found = fw_load(key)
  if not found then return end
  if window == floordiv(taken_at, w.period) then count = max(0, count - cost) end
  fixed_window.save(w, key, {window = window, count = count}, ctx)
end
