-- fixed_window.lua: the twin of fixed_window (src/algorithm/window.cc).
--
-- State, in one of two forms; both are read whichever a limit writes:
--   - text: "window count" (window = floor(now_us / period_us));
--   - integer (store.redis.window_state: integer; only at Redis' time, and
--     only a count within the limit): count * 256 + the window's tag
--     (common.lua, window_tag). A request raises the count with one INCRBY
--     (fixed_window.incr_keys), not a GET and a SET. Such a key lives at most
--     until the end of the window after its own (common.lua, "How long a
--     window's key is kept"), so the tag names its window.
-- No key is an empty window.

local fixed_window = {}

-- {limit, period, integer}: `integer`, the integer form, where the limit
-- asks for it ("fw <limit> <period> i") and its counts fit it (below 2^53).
function fixed_window.params(argv, i)
  local w = window_params(argv, i)
  w.integer = argv[i + 3] == 'i' and w.limit * 256 < TWO52
  return w
end

-- window, count and whether the key exists; an integer state is read as of
-- `now`.
local function fw_load(key, w, now)
  local s = call('GET', key)
  if not s then return 0, 0, false end
  local window, count
  if find(s, ' ', 1, true) then
    window, count = split2(s)
  else
    window, count = tagged_window(tonum(s), floordiv(now, w.period))
  end
  if count == nil then error('sluice: malformed state "' .. s .. '"') end
  return window, count, true
end

local fw_plan = {}

-- The count of `window` (at or after the state's): the state's own, or what
-- is left of its debt (the C++ CountIn).
local function fw_count_in(st_window, st_count, window, limit)
  if window == st_window then return st_count end
  local later = window - st_window
  if later >= windows_spanned(st_count, limit) then return 0 end
  return max(0, st_count - later * limit)
end

function fixed_window.decide(w, key, ctx, cost, reuse)
  local now, limit = ctx.now, w.limit
  local st_window, st_count = fw_load(key, w, now)
  -- A clock that went back stays in the latest window seen.
  local window = max(floordiv(now, w.period), st_window)
  local count = fw_count_in(st_window, st_count, window, limit)
  local start = window * w.period
  local d = decision(limit)
  local used = count
  if cost > limit then
    d.retry = INFINITE
  elseif count + cost <= limit then
    d.allowed = 1
    used = count + cost
  else
    -- The window where the request fits: the next, unless debt is left.
    d.retry = start + windows_spanned(count + cost - limit, limit) * w.period - now
  end
  d.remaining = limit - used  -- below zero by a debt (op G)
  d.reset = (used > 0) and (start + windows_spanned(used, limit) * w.period - now) or 0
  if d.allowed == 1 and cost > 0 then
    local plan = reuse and fw_plan or {}
    plan.window, plan.count = window, used
    return d, plan
  end
  return d, nil
end

-- A request of `cost` to an empty key at `now` (the driver's read with the
-- write, common.lua, "How the driver reads a key"): the state it leaves,
-- its expiry's text, and the answer's remaining and reset_after (its
-- limit is the limit's own); false where it might not fit.
function fixed_window.empty(w, now, cost)
  if not w.integer then return window_empty(w, now, cost, 1, ' ') end
  local limit, period = w.limit, w.period
  if cost > limit then return false end
  local index = floordiv(now, period)
  return tagged_text(w, cost * 256 + window_tag(index)), expiry_of(w, now + period),
         limit - cost, (index + 1) * period - now
end

-- What every request of a run (one limit, one cost > 0, one `now`: the
-- driver's run of short parts) shares in fixed_window.incr_keys, made once a run
-- in the limit's own table `w.run`: the window's tag and the one before,
-- the INCRBY's step, and a fresh key's state, expiry and reset_after (those
-- of an empty key: fixed_window.empty). nil where INCRBY cannot decide (a
-- cost above the limit).
function fixed_window.incr_run(w, ctx, cost)
  local limit = w.limit
  if cost > limit then return nil end
  local now = ctx.now
  local window = floordiv(now, w.period)
  local rc = incr_run_of(w, cost * 256)
  rc.limit, rc.cost, rc.now = limit, cost, now
  rc.tag, rc.tag_before = window_tag(window), window_tag(window - 1)
  local _
  rc.fresh_state, rc.expiry, _, rc.ends = fixed_window.empty(w, now, cost)
  return rc
end

-- The requests j = from .. g - 1 of the run `rc` (incr_run), keys[k + j],
-- at Redis' time, each by one INCRBY, for a limit in the integer form
-- whose keys lately held states (the driver, "How the driver reads a key"):
-- each answered in the reply after its first m elements (its short answer,
-- or one element: below), counted in the limit's `fresh`, until the
-- run ends, a request INCRBY cannot decide, or `fresh` says keys are now
-- found empty. Returns the next request's j and the reply's length; a
-- request INCRBY could not decide leaves its key as it was (a window the
-- tag does not place next to now). A key INCRBY cannot raise (a text
-- state) fails it: the loop ends there with an error, and the driver
-- resumes at that request (what `fresh` counted in this loop is then
-- lost). Before each request, rc.at_j and rc.at_m say where it is.
--   - The count of this window raised within the limit: decided, one command.
--   - Raised past it: given back (DECRBY) and denied.
--   - The window before (spent: a count within the limit), or no key (the
--     INCRBY made one with no expiry): written as a fresh key of this window.
-- One loop for the run, not a call a request: a Lua call costs Redis about
-- 200 instructions, and the driver's steps around it more.
function fixed_window.incr_keys(rc, keys, k, j, g, reply, m)
  local w, step_s, tag, limit, ends = rc.w, rc.step_s, rc.tag, rc.limit, rc.ends
  local fresh = w.fresh
  -- The reset_after of the loop's last answer: an allowed request after
  -- one of the run's (ends: every answer here has it) is one element,
  -- 2 x remaining + 1 (driver.lua, the reply), not three.
  local reset_before
  while j < g do
    rc.at_j, rc.at_m = j, m
    local key = keys[k + j]
    -- On a key that holds no integer state, INCRBY fails, leaving it as it
    -- was, and the driver reads that key with GET (driver.lua, decide):
    -- rarer than a test of what INCRBY answered is dear (type() costs
    -- Redis about 600 instructions a decision).
    local v = call('INCRBY', key, step_s)
    local r = v % 256
    local remaining  -- of an allowed request
    if r == tag then
      local count = (v - r) / 256
      if count <= limit then
        remaining = limit - count
      else
        call('DECRBY', key, step_s)
        -- As fast's denial: the request fits at the next window.
        reply[m + 1], reply[m + 2], reply[m + 3] = -ends - 2, limit - (count - rc.cost), ends
        m, reset_before = m + 3, ends
      end
    elseif r == 0 or r == rc.tag_before then
      call('SET', key, rc.fresh_state, 'PXAT', rc.expiry)
      remaining = limit - rc.cost
    else
      call('DECRBY', key, step_s)
      w.fresh = fresh
      return j, m
    end
    if remaining == nil then  -- denied, answered above
    elseif reset_before == ends then
      m = m + 1
      reply[m] = 2 * remaining + 1
    else
      reply[m + 1], reply[m + 2], reply[m + 3] = 0, remaining, ends
      m, reset_before = m + 3, ends
    end
    j = j + 1
    -- How its key was found (common.lua, "How the driver reads a key"):
    -- the window before's state, replaced by the driver's read as an empty
    -- key is (fixed_window.replaced), counts as none.
    if r == tag then
      fresh = fresh - HELD_WEIGHT
      if fresh < -8 then fresh = -8 end
    else
      fresh = fresh + 1
      if fresh >= 0 then break end
    end
  end
  w.fresh = fresh
  return j, m
end

-- Where a run's keys lately held no state of their window (found empty, or
-- holding the window before's: common.lua, "How the driver reads a key"),
-- the driver reads a key with the write of a fresh key's state that
-- replaces what it held (SET ... PXAT ... GET), one command for both. `s`
-- is the state it replaced, of the request j of the run `rc` (incr_run);
-- then, one of:
--   - nil: `s` was spent (the window before's integer state, a count within
--     the limit, over when this window began): the fresh state is right,
--     and the request is answered as one to an empty key;
--   - the short answer (code, remaining, reset_after) of a request to this
--     window's integer state: its count is added back to the fresh state's
--     (INCRBY), or, where the request does not fit, `s` is put back, as it
--     was (its value; its expiry is the fresh state's: later than its own,
--     and before the end of the window after);
--   - false: any other state (text, a debt, a window the tag does not place
--     before or at now, malformed) is put back with an expiry no earlier than
--     its own, and the driver decides the request from it as read by GET.
function fixed_window.replaced(rc, key, s)
  local v = tonum(s)
  if v ~= nil and v >= 0 and v % 1 == 0 then
    local r = v % 256
    if r == rc.tag_before then return nil end
    if r == rc.tag then
      local count, limit, cost, ends = (v - r) / 256, rc.limit, rc.cost, rc.ends
      if count + cost <= limit then
        call('INCRBY', key, tagged_text(rc.w, v - r))
        return 0, limit - count - cost, ends
      end
      call('SET', key, s, 'KEEPTTL')
      -- As fast's denial: the request fits at the next window.
      return -ends - 2, limit - count, ends
    end
  end
  -- Its own expiry was at most a period after the state is fresh; the end of
  -- the window after the last its count weighs on is at least that.
  local w = rc.w
  local window, count
  if v ~= nil then
    window, count = tagged_window(v, floordiv(rc.now, w.period))
  else
    window, count = split2(s)
  end
  if window == nil or count == nil then
    call('SET', key, s, 'KEEPTTL')  -- malformed: the decision says so
  else
    local fresh_at = (window + windows_spanned(max(count, 1), w.limit) + 1) * w.period
    call('SET', key, s, 'PXAT', fmt(ceildiv(fresh_at, 1000)))
  end
  return false
end

-- The common case of decide and save, as gcra.fast: no debt, a cost within
-- the limit.
function fixed_window.fast(w, key, ctx, cost, writes, s)
  local limit, period = w.limit, w.period
  if cost > limit then return end
  local now = ctx.now
  -- floordiv(now, period), written out: the window and its start.
  local start = now % period
  if start < 0 then start = start + period end
  start = now - start
  local window, count = start / period, 0
  local space  -- where the state is text, the end of its window's digits
  if s then
    space = find(s, ' ', 1, true)
    local st_window, st_count
    if space == nil then
      st_window, st_count = tagged_window(tonum(s), window)
    else
      -- The texts of the window and count read as their numbers where they
      -- are kept (window_text, COUNT_OF), else by tonumber.
      local st_window_text, st_count_text = sub(s, 1, space - 1), sub(s, space + 1)
      st_window = st_window_text == w.window_text and w.window_index or tonum(st_window_text)
      st_count = COUNT_OF[st_count_text] or tonum(st_count_text)
    end
    if st_window == nil or st_count == nil or st_count < 0 or st_count > limit or
       st_window > window then
      return
    end
    -- A state of at most the limit is spent when its window ends.
    if st_window == window then count = st_count end
  end
  local used = count + cost
  if used <= limit then
    if writes and cost > 0 then
      if count > 0 and space == nil and w.integer and ctx.timed then
        -- This window's integer state, raised where it is: its count is
        -- the bits above the tag, and INCRBY keeps the key's expiry, one
        -- this state calls for already (below). About 2,400 instructions
        -- less than SET ... KEEPTTL.
        call('INCRBY', key, step_text_of(w, cost * 256))
      else
        local value
        if w.integer and ctx.timed then
          value = tagged_text(w, used * 256 + window_tag(window))
        else
          -- window_text and count_text where they keep the text, written out.
          local window_digits = w.window_index == window and w.window_text or window_text(w, window)
          value = window_digits .. ' ' .. (COUNT_TEXTS[used] or count_text(used))
        end
        -- store_fresh, or the expiry kept (common.lua), written out: a key
        -- of this window with a count has an expiry this state calls for
        -- already.
        if not ctx.timed then
          call('SET', key, value)
        elseif count > 0 then
          call('SET', key, value, 'KEEPTTL')
        else
          -- Fresh at start + period, kept now - start more (common.lua,
          -- "How long a window's key is kept").
          call('SET', key, value, 'PXAT', expiry_of(w, now + period))
        end
      end
    end
    return 1, limit, limit - used, (used > 0) and (start + period - now) or 0, 0, 0
  end
  -- Denied: count > 0, and count + cost - limit is at most the limit, so
  -- the window resets, and the request fits, at the next window.
  return 0, limit, limit - count, start + period - now, start + period - now, 0
end

function fixed_window.save(w, key, st, ctx)
  local fresh_at = nil
  if st.count > 0 then fresh_at = (st.window + windows_spanned(st.count, w.limit)) * w.period end
  local value
  if w.integer and ctx.timed and st.count <= w.limit then
    value = fmt(st.count * 256 + window_tag(st.window))
  else
    value = fmt2(st.window, st.count)  -- a debt is kept as text
  end
  store_string(key, value, fresh_at, ctx, w, ctx.now % w.period)
end

function fixed_window.charge(w, key, ctx, cost)
  if cost <= 0 then return end
  local st_window, st_count = fw_load(key, w, ctx.now)
  local window = max(floordiv(ctx.now, w.period), st_window)
  local count = fw_count_in(st_window, st_count, window, w.limit)
  local top = max_window_count(w)
  if cost >= top - count then count = max(top, count) else count = count + cost end
  fixed_window.save(w, key, {window = window, count = count}, ctx)
end

function fixed_window.refund(w, key, ctx, taken_at, cost)
  local window, count, found = fw_load(key, w, ctx.now)
  if not found then return end
  if window == floordiv(taken_at, w.period) then count = max(0, count - cost) end
  fixed_window.save(w, key, {window = window, count = count}, ctx)
end
