-- sliding_log.lua: the twin of sliding_log (src/algorithm/sliding_log.cc).
--
-- State: a list. Index 0 is the header "last_us:total" (the latest time
-- seen, and the cost of the entries); then one entry per admitted instant,
-- oldest first: "time_us" for cost 1, "time_us cost" otherwise. Requests at
-- the same instant share one entry, so times strictly increase and an
-- entry's text is unique. A concurrency limit (sliding_log.concurrency,
-- below) names an admitted request's entry by its slot, "time_us cost
-- slot", which joins no other (times then only never decrease); such an
-- entry is given back by its name alone. At most `limit` entries (each
-- holds cost >= 1 and the total stays within the limit), like the C++
-- ring; no key is an empty log. Decide reads the header, the entries that
-- leave the window (usually none or one) and, when denied, as many of the
-- oldest as must leave for the request to fit: never the whole log in the
-- common case.

local sliding_log = {params = window_params}

-- An entry's time, cost and slot (nil: unnamed).
local function sl_entry(s)
  local space = find(s, ' ', 1, true)
  if not space then return tonum(s), 1, nil end
  local second = find(s, ' ', space + 1, true)
  if not second then return tonum(sub(s, 1, space - 1)), tonum(sub(s, space + 1)), nil end
  return tonum(sub(s, 1, space - 1)), tonum(sub(s, space + 1, second - 1)), sub(s, second + 1)
end

local function sl_format(time_us, cost, slot)
  if slot then return fmt(time_us) .. ' ' .. fmt(cost) .. ' ' .. slot end
  if cost == 1 then return fmt(time_us) end
  return fmt(time_us) .. ' ' .. fmt(cost)
end

-- Returns last_us, total, entries (0, 0, 0 when there is no key).
local function sl_header(key)
  local h = call('LINDEX', key, '0')
  if not h then return 0, 0, 0 end
  local colon = find(h, ':', 1, true)
  if not colon then error('sluice: malformed sliding_log header "' .. h .. '"') end
  return tonum(sub(h, 1, colon - 1)), tonum(sub(h, colon + 1)),
         call('LLEN', key) - 1
end

-- Iterates entries first..last (list indices), oldest first, reading them in
-- growing chunks: returns index, time_us, cost, slot, or nil after the last.
local function sl_entries(key, first, last)
  local i, buf, buf_first, chunk = first - 1, {}, first, 4
  return function()
    i = i + 1
    if i > last then return nil end
    if i >= buf_first + #buf then
      buf = call('LRANGE', key, i, min(i + chunk - 1, last))
      buf_first = i
      chunk = min(chunk * 2, 256)
    end
    local t, c, s = sl_entry(buf[i - buf_first + 1])
    return i, t, c, s
  end
end

local function sl_expire(key, fresh_at, ctx)
  if ctx.timed then
    call('PEXPIRE', key, fmt(ceildiv(fresh_at - ctx.now, 1000)))
  else
    call('PERSIST', key)
  end
end

function sliding_log.decide(w, key, ctx, cost)
  local now, period, limit = ctx.now, w.period, w.limit
  local last, total, n = sl_header(key)
  -- Decide as of the latest time seen, so a clock that went back grants nothing.
  local at = max(last, now)
  local next_entry = sl_entries(key, 1, n)
  local dropped = 0  -- entries older than the window (at - period, at]
  local i, t, c
  local last_entry = nil  -- the newest entry's time, read once
  if n > 0 then last_entry = sl_entry(call('LINDEX', key, '-1')) end
  if last_entry and last_entry <= at - period then
    -- The newest has left the window, so all have: no walk (a key idle for
    -- a period would otherwise cost a pass over its whole log).
    dropped, total = n, 0
  else
    i, t, c = next_entry()
    while i and t <= at - period do
      dropped = dropped + 1
      total = total - c
      i, t, c = next_entry()
    end
  end
  local d = decision(limit)
  if cost > limit then
    d.retry = INFINITE
  elseif total + cost <= limit then
    d.allowed = 1
  else
    -- The request fits once enough of the oldest entries have left the window.
    local freed = 0
    while i do
      freed = freed + c
      if total - freed + cost <= limit then
        d.retry = t + period - now
        break
      end
      i, t, c = next_entry()
    end
  end
  local newest = nil
  if n > dropped then newest = last_entry end
  local take = d.allowed == 1 and cost > 0
  if take then
    total = total + cost
    d.reset = at + period - now
  elseif newest then
    d.reset = newest + period - now
  end
  d.remaining = limit - total
  if take then
    return d, {at = at, total = total, cost = cost, entries = n, dropped = dropped,
               newest = newest, slot = w.named and ctx.slot or nil}
  end
  return d, nil
end

function sliding_log.save(w, key, plan, ctx)
  local header = fmt(plan.at) .. ':' .. fmt(plan.total)
  if plan.dropped > 0 then
    -- Keep the last dropped entry as the slot the header is written into.
    call('LTRIM', key, plan.dropped, '-1')
  end
  if plan.entries > 0 then
    call('LSET', key, '0', header)
  else
    call('RPUSH', key, header)
  end
  local joined = false
  if plan.newest == plan.at and not plan.slot then
    -- Same instant as the newest entry, neither named: one entry.
    local _, cost, slot = sl_entry(call('LINDEX', key, '-1'))
    if not slot then
      call('LSET', key, '-1', sl_format(plan.at, cost + plan.cost))
      joined = true
    end
  end
  if not joined then call('RPUSH', key, sl_format(plan.at, plan.cost, plan.slot)) end
  sl_expire(key, plan.at + w.period, ctx)
end

-- Takes `cost` from the oldest entry at or after `taken_at` (the one the
-- refunded request joined) and the entries after it; an emptied entry is
-- erased. Returns how many were erased.
local function sl_remove_cost(key, n, taken_at, cost, total)
  -- Refunds follow their request closely: search from the newest entry.
  local first = n + 1
  while first > 1 do
    local lo = max(1, first - 16)
    local chunk = call('LRANGE', key, lo, first - 1)
    local j = #chunk
    while j >= 1 and sl_entry(chunk[j]) >= taken_at do j = j - 1 end
    first = lo + j
    if j >= 1 then break end
  end
  local next_entry = sl_entries(key, first, n)
  local removed = 0
  local i, t, c, s = next_entry()
  while cost > 0 and i do
    local take = min(cost, c)
    total = total - take
    cost = cost - take
    if c > take then
      call('LSET', key, i, sl_format(t, c - take, s))
      break
    end
    call('LSET', key, i, 'x')  -- erased below, in one pass
    removed = removed + 1
    i, t, c, s = next_entry()
  end
  if removed > 0 then call('LREM', key, removed, 'x') end
  return removed, total
end

-- Erases the oldest entry named `slot` at or after `taken_at` (as the C++
-- does; names are random, so there is one): its cost, or nil when there is
-- none.
local function sl_remove_named(key, n, taken_at, slot)
  local found, cost = nil, nil
  local first = n + 1  -- searched from the newest, a chunk at a time
  while first > 1 do
    local lo = max(1, first - 16)
    local chunk = call('LRANGE', key, lo, first - 1)
    local j = #chunk
    while j >= 1 do
      local t, c, s = sl_entry(chunk[j])
      if t < taken_at then break end
      if s == slot then found, cost = chunk[j], c end
      j = j - 1
    end
    if j >= 1 then break end
    first = lo
  end
  if found then call('LREM', key, '1', found) end  -- the oldest of its text
  return cost
end

-- Gives back `cost` taken at `taken_at`; a concurrency limit's slots named
-- ctx.slot by their name alone. Returns whether they were found (named
-- slots) or anything could be taken back (counted).
function sliding_log.refund(w, key, ctx, taken_at, cost)
  local last, total, n = sl_header(key)
  if n == 0 then return false end
  local slot = w.named and ctx.slot or nil
  local found = false
  -- A request that has left the window holds no place in the log any more:
  -- the entry at or after `taken_at` would be another request's.
  if taken_at > last - w.period and (slot or cost > 0) then
    local removed = 0
    if slot then
      local c = sl_remove_named(key, n, taken_at, slot)
      if c then removed, total, found = 1, total - c, true end
    else
      removed, total = sl_remove_cost(key, n, taken_at, cost, total)
      found = true
    end
    if removed == n then
      call('DEL', key)
      return found
    end
    if found then call('LSET', key, '0', fmt(last) .. ':' .. fmt(total)) end
  end
  local newest = sl_entry(call('LINDEX', key, '-1'))
  if newest + w.period <= ctx.now then
    call('DEL', key)
  else
    sl_expire(key, newest + w.period, ctx)
  end
  return found
end

-- A concurrency limit: the log whose period is the lease TTL, each
-- request's entry named by the slot its holder chose (ctx.slot, set by the
-- part), given back (refund) and renewed by that name.
sliding_log.concurrency = {
  params = function(argv, i)
    local w = window_params(argv, i)
    w.named = true
    return w
  end,
  decide = sliding_log.decide, save = sliding_log.save, refund = sliding_log.refund,
}
