-- sliding_window.lua: the twin of sliding_window (src/algorithm/window.cc).
--
-- State: the string "window prev curr"; no key is two empty windows.
--
-- The C++ compares prev * (period - elapsed) + curr * period with
-- limit * period in 128 bits (up to 2^85). Here the same tests are
-- rewritten around F = floor(prev * elapsed / period), computed exactly by
-- muldiv, and r, its remainder:
--   prev * (period - elapsed) = (prev - F) * period - r, 0 <= r < period,
-- so  weighted + x * period <= limit * period  <=>  prev - F + x <= limit
-- and floor((limit * period - weighted - x * period) / period) is
-- limit - prev + F - x when that is >= 0 (the C++ `remaining`).

local sliding_window = {params = window_params}

-- window, prev, curr, found.
local function sw_load(key)
  local s = call('GET', key)
  if not s then return 0, 0, 0, false end
  local window, prev, curr = split3(s)
  return window, prev, curr, true
end

local sw_plan = {}

-- Earliest elapsed time e in [0, period] of a window with `prev` behind it
-- at which prev * (period - e) <= room * period; period when none before
-- the end (the C++ EarliestElapsed).
local function earliest_elapsed(prev, room, period)
  if prev == 0 or room >= prev then return 0 end  -- room >= prev: fits >= period
  local fits = muldiv(room, period, prev)  -- < period
  return period - fits
end

function sliding_window.decide(w, key, ctx, cost, reuse)
  local now, period, limit = ctx.now, w.period, w.limit
  local st_window, st_prev, st_curr = sw_load(key)
  local index = max(floordiv(now, period), st_window)
  local prev, curr = 0, 0
  if index == st_window then
    prev, curr = st_prev, st_curr
  elseif index == st_window + 1 then
    prev = st_curr
  end
  local window_start = index * period
  -- Clamped: a clock that went back counts the previous window in full.
  local elapsed = min(max(now - window_start, 0), period - 1)
  local F = muldiv(prev, elapsed, period)
  local d = decision(limit)
  local curr_after = curr
  if cost > limit then
    d.retry = INFINITE
  elseif prev - F + curr + cost <= limit then
    d.allowed = 1
    curr_after = curr + cost
  else
    -- In this window, once prev's weight has shrunk enough; else in the next
    -- one, where curr becomes prev; else two windows on, when all is gone.
    local retry_at
    local room = limit - curr - cost
    local e_here = period
    if room >= 0 then e_here = earliest_elapsed(prev, room, period) end
    if e_here < period then
      retry_at = window_start + e_here
    else
      local e_next = earliest_elapsed(curr, limit - cost, period)
      if e_next < period then
        retry_at = window_start + period + e_next
      else
        retry_at = window_start + 2 * period
      end
    end
    d.retry = max(retry_at - now, 1)
  end
  d.remaining = max(limit - prev + F - curr_after, 0)
  local fresh_at = now
  if curr_after > 0 then
    fresh_at = window_start + 2 * period
  elseif prev > 0 then
    fresh_at = window_start + period
  end
  d.reset = max(fresh_at - now, 0)
  if d.allowed == 1 and cost > 0 then
    local plan = reuse and sw_plan or {}
    plan.window, plan.prev, plan.curr = index, prev, curr_after
    return d, plan
  end
  return d, nil
end

function sliding_window.save(w, key, st, ctx)
  local fresh_at = nil
  if st.curr > 0 then
    fresh_at = (st.window + 2) * w.period
  elseif st.prev > 0 then
    fresh_at = (st.window + 1) * w.period
  end
  store_string(key, fmt3(st.window, st.prev, st.curr), fresh_at, ctx, w)
end

function sliding_window.refund(w, key, ctx, taken_at, cost)
  local window, prev, curr, found = sw_load(key)
  if not found then return end
  local taken_window = floordiv(taken_at, w.period)
  if taken_window == window then
    curr = max(0, curr - cost)
  elseif taken_window + 1 == window then
    prev = max(0, prev - cost)
  end
  sliding_window.save(w, key, {window = window, prev = prev, curr = curr}, ctx)
end
