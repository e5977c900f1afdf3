-- quota.lua: Envoy's quota service (RLQS) across sluice instances
-- (docs/envoy.md, "Quota service (RLQS)"). One hash per bucket: a field per
-- instance, "claim want until_us", the claim being the part of the bucket's
-- limit the instance may assign to its Envoys. Rates are integers, in
-- micro-requests per second.
--
--   FCALL <name>_quota 1 key instance want floor limit ttl_us
--
-- Claims past their time are dropped. The caller gets its max-min fair
-- share of the limit among the live instances, by their wants, within what
-- the others' claims leave free, and never below `floor` (what its Envoys
-- may still be enforcing, which it cannot take back before their
-- assignments pass). Replies {claim, target, now_us}: the target is the
-- fair share, which the instance shrinks its Envoys to (its claim follows
-- once they hold no more), so that the others can grow.

local quota = {}

function quota.claim(keys, args)
  if floor == nil then bind_globals() end
  local key, me = keys[1], args[1]
  if key == nil or me == nil or me == '' or #args ~= 5 then
    error('sluice: FCALL <name>_quota 1 key instance want floor limit ttl_us')
  end
  local want, low = int_arg(args[2], 'want'), int_arg(args[3], 'floor')
  local limit, ttl = int_arg(args[4], 'limit'), int_arg(args[5], 'ttl_us')
  if want < 0 or low < 0 or limit < 0 or ttl <= 0 then
    error('sluice: quota claim arguments must not be negative')
  end
  want = min(want, limit)
  local t = call('TIME')
  local now = tonum(t[1]) * 1000000 + tonum(t[2])
  local all = call('HGETALL', key)
  local others, wants, last = 0, {want}, now + ttl
  for i = 1, #all, 2 do
    local field = all[i]
    if field ~= me then
      local c, w, u = split3(all[i + 1])
      if u == nil or u <= now then
        call('HDEL', key, field)
      else
        others = others + c
        wants[#wants + 1] = min(w, limit)
        last = max(last, u)
      end
    end
  end
  -- Max-min fair: ascending wants, each gets min(want, an equal part of
  -- what is left); mine is found by value (equal wants get equal parts).
  table.sort(wants)
  local left, target = limit, 0
  for k = 1, #wants do
    local part = floor(left / (#wants - k + 1))
    local give = min(wants[k], part)
    if wants[k] == want then
      target = give
      break
    end
    left = left - give
  end
  local claim = max(low, min(target, limit - others))
  call('HSET', key, me, fmt3(claim, want, now + ttl))
  call('PEXPIREAT', key, floor(last / 1000) + 1)
  return {claim, target, now}
end
