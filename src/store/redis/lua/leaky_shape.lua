-- leaky_shape.lua: the twin of leaky_bucket mode shape
-- (src/algorithm/leaky_bucket.cc).
--
-- State: the next free departure time in ticks, as "us" or "us rem" (see
-- split_ticks); no key is a line that is free now. Refund gives nothing back
-- (a departure slot once given is kept), so the driver never calls it.

local leaky_shape = {}

-- {per_us, per_token, capacity, bound}: bound is the longest wait in ticks.
function leaky_shape.params(argv, i)
  return {per_us = int_arg(argv[i + 1], 'ticks_per_us'),
          per_token = int_arg(argv[i + 2], 'ticks_per_token'),
          capacity = int_arg(argv[i + 3], 'capacity'),
          bound = int_arg(argv[i + 4], 'bound_ticks')}
end

function leaky_shape.decide(s, key, ctx, cost)
  local now = ctx.now
  local nf_us, nf_rem = split_ticks(call('GET', key) or nil)
  local d = decision(s.capacity)
  -- wait = max(next_free, now) - now, in ticks
  local wait = ticks_after(s.per_us, now, nf_us, nf_rem)
  if wait == nil then
    -- Far ahead (the clock went far back): past the bound, so denied.
    local D = nf_us - now
    d.reset = D + ((nf_rem > 0) and 1 or 0)
    if cost > s.capacity then
      d.retry = INFINITE
    else
      local last_unit = (cost > 0) and (cost - 1) * s.per_token or 0
      d.retry = D + ceildiv_signed(nf_rem + last_unit - s.bound, s.per_us)
    end
    return d, nil
  end
  local function remaining_after(w)
    if w > s.bound then return 0 end
    return floordiv(s.bound - w, s.per_token) + 1
  end
  if cost > s.capacity then  -- its last unit could never fit in the bound
    d.retry = INFINITE
    d.remaining = remaining_after(wait)
    d.reset = ceildiv(wait, s.per_us)
    return d, nil
  end
  local last_unit_wait = wait + ((cost > 0) and (cost - 1) * s.per_token or 0)
  if last_unit_wait <= s.bound then
    d.allowed = 1
    d.delay = ceildiv(wait, s.per_us)
    local after = wait
    if cost > 0 then after = wait + cost * s.per_token end
    d.remaining = remaining_after(after)
    d.reset = ceildiv(after, s.per_us)
    if cost > 0 then
      local us, rem = ticks_from(s.per_us, now, after)
      return d, {us = us, rem = rem}
    end
    return d, nil
  end
  d.remaining = remaining_after(wait)
  d.reset = ceildiv(wait, s.per_us)
  d.retry = ceildiv(last_unit_wait - s.bound, s.per_us)
  return d, nil
end

function leaky_shape.save(s, key, st, ctx)
  store_string(key, format_ticks(st.us, st.rem), ceil_ticks(st.us, st.rem), ctx, s)
end
