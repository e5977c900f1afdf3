-- sliding_window.lua: the twin of sliding_window (src/algorithm/window.cc).
--
-- State, in one of two forms; both are read whichever a limit writes:
--   - text: "window prev curr";
--   - integer (store.redis.window_state: integer; only at Redis' time, and
--     only counts within the limit): (curr * (limit + 1) + prev) * 256 +
--     the window's tag (common.lua, window_tag). A request raises curr with
--     one INCRBY (sliding_window.incr_keys), not a GET and a SET.
-- No key is two empty windows.
--
-- The C++ compares prev * (period - elapsed) + curr * period with
-- limit * period in 128 bits (up to 2^85). Here the same tests are
-- rewritten around F = floor(prev * elapsed / period), computed exactly by
-- muldiv, and r, its remainder:
--   prev * (period - elapsed) = (prev - F) * period - r, 0 <= r < period,
-- so  weighted + x * period <= limit * period  <=>  prev - F + x <= limit
-- and floor((limit * period - weighted - x * period) / period) is
-- limit - prev + F - x (the C++ `remaining`, below zero by a debt).

local sliding_window = {}

-- {limit, period, integer, m}: `integer`, the integer form, where the limit
-- asks for it ("sw <limit> <period> i") and its counts fit it (below 2^53);
-- m = limit + 1, the unit of curr in it.
function sliding_window.params(argv, i)
  local w = window_params(argv, i)
  w.m = w.limit + 1
  w.integer = argv[i + 3] == 'i' and w.m * w.m * 256 < TWO52
  return w
end

-- The window, prev and curr of the integer state `v` read in window `ref`;
-- nil when `v` is not one.
local function sw_integer(w, v, ref)
  local window, counts = tagged_window(v, ref)
  if window == nil then return nil end
  local prev = counts % w.m
  return window, prev, (counts - prev) / w.m
end

-- The integer state's number.
local function sw_tagged(w, window, prev, curr)
  return (curr * w.m + prev) * 256 + window_tag(window)
end

-- window, prev, curr, found; an integer state is read as of `now`.
local function sw_load(key, w, now)
  local s = call('GET', key)
  if not s then return 0, 0, 0, false end
  if find(s, ' ', 1, true) then
    local window, prev, curr = split3(s)
    return window, prev, curr, true
  end
  local window, prev, curr = sw_integer(w, tonum(s), floordiv(now, w.period))
  if window == nil then error('sluice: malformed state "' .. s .. '"') end
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

-- The counts `later` windows after (prev, curr): what is over the limit in
-- curr (debt, op G) is carried into the next window and repaid at the
-- limit per window (the C++ RollBy).
local function sw_left(curr, k, limit)  -- what is left of curr k windows on
  if k > floordiv(curr, limit) + 1 then return 0 end
  return max(0, curr - k * limit)
end

local function sw_roll_by(prev, curr, later, limit)
  if later == 0 then return prev, curr end
  if curr <= limit then  -- no debt, the common case
    if later == 1 then return curr, 0 end
    return 0, 0
  end
  return min(limit, sw_left(curr, later - 1, limit)), sw_left(curr, later, limit)
end

-- `loaded`: the key's state, already read ({window, prev, curr}), or nil.
function sliding_window.decide(w, key, ctx, cost, reuse, loaded)
  local now, period, limit = ctx.now, w.period, w.limit
  local st_window, st_prev, st_curr
  if loaded then
    st_window, st_prev, st_curr = loaded.window, loaded.prev, loaded.curr
  else
    st_window, st_prev, st_curr = sw_load(key, w, now)
  end
  local index = max(floordiv(now, period), st_window)
  local prev, curr = sw_roll_by(st_prev, st_curr, index - st_window, limit)
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
    -- In this window, once prev's weight has shrunk enough; else in the
    -- first window where curr leaves room (the next, unless debt is left),
    -- once its prev has shrunk enough; else in the one after.
    local retry_at
    local room = limit - curr - cost
    local e_here = period
    if room >= 0 then e_here = earliest_elapsed(prev, room, period) end
    if e_here < period then
      retry_at = window_start + e_here
    else
      local k = max(1, windows_spanned(curr + cost - limit, limit))
      local then_prev, then_curr = sw_roll_by(prev, curr, k, limit)
      local e_then = earliest_elapsed(then_prev, limit - then_curr - cost, period)
      if e_then < period then
        retry_at = window_start + k * period + e_then
      else
        retry_at = window_start + (k + 1) * period
      end
    end
    d.retry = max(retry_at - now, 1)
  end
  d.remaining = limit - prev + F - curr_after  -- below zero by a debt (op G)
  local fresh_at = now
  if curr_after > 0 then
    fresh_at = window_start + (windows_spanned(curr_after, limit) + 1) * period
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

-- A request of `cost` to an empty key at `now`, as fixed_window.empty.
function sliding_window.empty(w, now, cost)
  if not w.integer then return window_empty(w, now, cost, 2, ' 0 ') end
  local limit, period = w.limit, w.period
  if cost > limit then return false end
  local index = floordiv(now, period)
  return tagged_text(w, sw_tagged(w, index, 0, cost)), expiry_of(w, now + 2 * period),
         limit - cost, (index + 2) * period - now
end

local sw_loaded = {}

-- What every request of a run (one limit, one cost > 0, one `now`) shares
-- in sliding_window.incr_keys, made once a run in `w.run`, as
-- fixed_window.incr_run: the window, its tag and the two before, the
-- INCRBY's step, the time elapsed in the window, and the expiry and
-- reset_after of a state written now (those of an empty key:
-- sliding_window.empty). nil where INCRBY cannot decide (a cost above the
-- limit).
function sliding_window.incr_run(w, ctx, cost)
  local limit, period, m = w.limit, w.period, w.m
  if cost > limit then return nil end
  local now = ctx.now
  local index = floordiv(now, period)
  local start = index * period
  local rc = incr_run_of(w, cost * m * 256)
  rc.ctx, rc.limit, rc.period, rc.m, rc.cost = ctx, limit, period, m, cost
  rc.index, rc.tag = index, window_tag(index)
  rc.tag_before, rc.tag_two_before = window_tag(index - 1), window_tag(index - 2)
  rc.elapsed = now - start  -- below the period
  local _
  _, rc.expiry, _, rc.ends = sliding_window.empty(w, now, cost)
  return rc
end

-- The requests j = from .. g - 1 of the run `rc` (incr_run), each by one
-- INCRBY, as fixed_window.incr_keys (what it returns, and when it stops).
--   - This window's curr raised, allowed: decided, one command (two where
--     curr was 0: its key then expires a window later).
--   - The window before (its curr becomes prev), two windows before or no
--     key (the INCRBY made one with no expiry): allowed, written as this
--     window's state with its expiry.
--   - Denied: the INCRBY given back (DECRBY), and decided by decide on the
--     state as it was.
function sliding_window.incr_keys(rc, keys, k, j, g, reply, at)
  local w, step_s, m, cost, index, tag = rc.w, rc.step_s, rc.m, rc.cost, rc.index, rc.tag
  local limit, period, elapsed, ends = rc.limit, rc.period, rc.elapsed, rc.ends
  local fresh = w.fresh
  -- The reset_after of the loop's last answer: an allowed request after
  -- one of the run's (ends) is one element, 2 x remaining + 1, as in
  -- fixed_window.incr_keys.
  local reset_before
  while j < g do
    rc.at_j, rc.at_m = j, at
    local key = keys[k + j]
    -- On a key that holds no integer state, INCRBY fails, leaving it as it
    -- was, and the driver reads that key with GET (driver.lua, decide):
    -- rarer than a test of what INCRBY answered is dear (type() costs
    -- Redis about 600 instructions a decision).
    local v = call('INCRBY', key, step_s)
    local r = v % 256
    local counts = (v - r) / 256
    local prev = counts % m
    local curr = (counts - prev) / m  -- with cost
    local st_window, st_prev, st_curr = index, prev, curr - cost
    if r ~= tag then
      if r == rc.tag_before then
        st_window, prev = index - 1, curr - cost
      elseif r == 0 or r == rc.tag_two_before then
        st_window, st_curr, prev = index - 2, 0, 0
      else
        call('DECRBY', key, step_s)
        w.fresh = fresh
        return j, at
      end
      curr = cost
    end
    -- F = floor(prev * elapsed / period), as fast; nil where the product is
    -- too large to form exactly (then decided as a text state is).
    local pe, F = prev * elapsed, 0
    if pe >= 2 * TWO52 then
      F = nil
    elseif pe > 0 then
      F = (pe - pe % period) / period  -- pe, period > 0: so is the remainder
    end
    if F == nil or prev - F + curr > limit then
      if r == 0 then call('DEL', key) else call('DECRBY', key, step_s) end
      if F == nil then
        w.fresh = fresh
        return j, at
      end
      local l = sw_loaded
      l.window, l.prev, l.curr = st_window, st_prev, st_curr
      local d = sliding_window.decide(w, key, rc.ctx, cost, true, l)
      local code
      if d.allowed == 1 then code = 2 * d.delay else code = -d.retry - 2 end
      reply[at + 1], reply[at + 2], reply[at + 3] = code, d.remaining, d.reset
      at, reset_before = at + 3, d.reset
    else
      if st_window ~= index then
        call('SET', key, tagged_text(w, (curr * m + prev) * 256 + tag), 'PXAT', rc.expiry)
      elseif st_curr == 0 then
        -- curr now weighs on the next window: kept until its end (common.lua).
        call('PEXPIREAT', key, rc.expiry)
      end
      if reset_before == ends then
        at = at + 1
        reply[at] = 2 * (limit - prev + F - curr) + 1
      else
        reply[at + 1], reply[at + 2], reply[at + 3] = 0, limit - prev + F - curr, ends
        at, reset_before = at + 3, ends
      end
    end
    j = j + 1
    -- How its key was found (common.lua, "How the driver reads a key").
    if r ~= 0 then
      if fresh > -8 then fresh = fresh - 1 end
    else
      fresh = fresh + 1
      if fresh >= 0 then break end
    end
  end
  w.fresh = fresh
  return j, at
end

-- The common case of decide and save, as gcra.fast: an allowed request,
-- no debt, a clock at or after the state's window, prev x elapsed below
-- 2^53. A denial is left to decide.
function sliding_window.fast(w, key, ctx, cost, writes, s)
  local limit, period = w.limit, w.period
  if cost > limit then return end
  local now = ctx.now
  -- floordiv(now, period), written out: the window and its start.
  local start = now % period
  if start < 0 then start = start + period end
  start = now - start
  local index = start / period
  local prev, curr = 0, 0
  -- prev's text, kept from the state where it is there.
  local prev_text = '0'
  -- Whether the state is this window's in the integer form.
  local integer_here = false
  local i = s and find(s, ' ', 1, true)
  if s and not i then  -- the integer form
    local st_window, st_prev, st_curr = sw_integer(w, tonum(s), index)
    if st_window == nil or st_curr > limit or st_window > index then return end
    if st_window == index then
      prev, curr = st_prev, st_curr
      integer_here = true
    elseif st_window + 1 == index then
      prev = st_curr
    end
    prev_text = nil
  elseif s then
    local j = find(s, ' ', i + 1, true)
    if j == nil then return end
    -- The texts read as their numbers where they are kept (window_text,
    -- COUNT_OF), else by tonumber.
    local st_window_text = sub(s, 1, i - 1)
    local st_window = st_window_text == w.window_text and w.window_index or tonum(st_window_text)
    local st_prev_text, st_curr_text = sub(s, i + 1, j - 1), sub(s, j + 1)
    prev = COUNT_OF[st_prev_text] or tonum(st_prev_text)
    curr = COUNT_OF[st_curr_text] or tonum(st_curr_text)
    if st_window == nil or prev == nil or curr == nil or prev < 0 or curr < 0 or curr > limit or
       st_window > index or prev % 1 ~= 0 or curr % 1 ~= 0 then
      return
    end
    -- sw_roll_by without debt.
    if st_window == index then
      prev_text = st_prev_text
    elseif st_window + 1 == index then
      prev, curr, prev_text = curr, 0, st_curr_text
    else
      prev, curr = 0, 0
    end
  end
  local elapsed = now - start  -- below the period
  if prev * elapsed >= 2 * TWO52 then return end
  local pe = prev * elapsed
  local r = pe % period
  if r < 0 then r = r + period end
  local F = (pe - r) / period
  local after = curr + cost
  if prev - F + after > limit then return end
  if writes and cost > 0 then
    if curr > 0 and integer_here and w.integer and ctx.timed then
      -- This window's integer state, its curr raised where it is, as
      -- fixed_window.fast: INCRBY keeps the key's expiry.
      call('INCRBY', key, step_text_of(w, cost * w.m * 256))
    else
      -- window_text and count_text where they keep the text, written out.
      local value
      if w.integer and ctx.timed then
        value = tagged_text(w, sw_tagged(w, index, prev, after))
      else
        local window_digits = w.window_index == index and w.window_text or window_text(w, index)
        local after_digits = COUNT_TEXTS[after] or count_text(after)
        value = window_digits .. ' ' .. (prev_text or COUNT_TEXTS[prev] or count_text(prev)) ..
                ' ' .. after_digits
      end
      -- store_fresh, or the expiry kept (common.lua), written out: a key
      -- of this window with a count has an expiry this state calls for
      -- already.
      if not ctx.timed then
        call('SET', key, value)
      elseif curr > 0 then
        call('SET', key, value, 'KEEPTTL')
      else
        -- Fresh at start + 2 * period, kept now - start more (common.lua,
        -- "How long a window's key is kept").
        call('SET', key, value, 'PXAT', expiry_of(w, now + 2 * period))
      end
    end
  end
  local reset = 0
  if after > 0 then
    reset = start + 2 * period - now
  elseif prev > 0 then
    reset = start + period - now
  end
  return 1, limit, limit - prev + F - after, reset, 0, 0
end

function sliding_window.save(w, key, st, ctx)
  local fresh_at = nil
  if st.curr > 0 then
    fresh_at = (st.window + windows_spanned(st.curr, w.limit) + 1) * w.period
  elseif st.prev > 0 then
    fresh_at = (st.window + 1) * w.period
  end
  local value
  if w.integer and ctx.timed and st.prev <= w.limit and st.curr <= w.limit then
    value = fmt(sw_tagged(w, st.window, st.prev, st.curr))
  else
    value = fmt3(st.window, st.prev, st.curr)  -- a debt is kept as text
  end
  store_string(key, value, fresh_at, ctx, w, ctx.now % w.period)
end

function sliding_window.charge(w, key, ctx, cost)
  if cost <= 0 then return end
  local st_window, st_prev, st_curr = sw_load(key, w, ctx.now)
  local index = max(floordiv(ctx.now, w.period), st_window)
  local prev, curr = sw_roll_by(st_prev, st_curr, index - st_window, w.limit)
  local top = max_window_count(w)
  if cost >= top - curr then curr = max(top, curr) else curr = curr + cost end
  sliding_window.save(w, key, {window = index, prev = prev, curr = curr}, ctx)
end

function sliding_window.refund(w, key, ctx, taken_at, cost)
  local window, prev, curr, found = sw_load(key, w, ctx.now)
  if not found then return end
  local taken_window = floordiv(taken_at, w.period)
  if taken_window == window then
    curr = max(0, curr - cost)
  elseif taken_window + 1 == window then
    prev = max(0, prev - cost)
  end
  sliding_window.save(w, key, {window = window, prev = prev, curr = curr}, ctx)
end
