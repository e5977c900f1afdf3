-- driver.lua: the entry point. Decides, checks or refunds one request over
-- the limits of one policy, one KEY per limit, all-or-nothing.
--
--   EVALSHA sha numkeys key... op now_us cost taken_at_us [code p1..p5]...
--
-- op "D": decide every limit on the current state without writing; only if
-- all allow are the new states written (a denial anywhere takes nothing
-- anywhere, as Limiter::AcquireAt's decide-refund-check does).
-- op "C": the same decisions, never written.
-- op "R": gives `cost` taken at taken_at_us back to every limit but a
-- leaky_bucket shape one, whose departure slot is kept.
-- now_us "": Redis' own clock (TIME), what every production call sends, so
-- that instances with skewed clocks agree; a decimal time is used instead
-- (the parity tests replay times), and then keys get no expiry, since that
-- time is not Redis' clock.
--
-- Reply: {now_us} followed, for D and C, by six integers per limit:
-- allowed (0/1), limit, remaining, reset_after_us, retry_after_us
-- (-1: never), delay_us.

if redis.replicate_commands then redis.replicate_commands() end

-- Each algorithm's file is wrapped in a loader (embed_script.cmake), and
-- only the algorithms a call uses are built: defining every algorithm's
-- functions on every call cost Redis about 9 us a call, half the script.
local LOADERS = {
  tb = load_token_bucket, gc = load_gcra, lp = load_leaky_police, ls = load_leaky_shape,
  fw = load_fixed_window, sl = load_sliding_log, sw = load_sliding_window,
}
local loaded = {}
local FIXED_ARGS = 4
local PARAMS_PER_LIMIT = 6

local op = ARGV[1]
if op ~= 'D' and op ~= 'C' and op ~= 'R' then
  error('sluice: op must be D, C or R, got "' .. tostring(op) .. '"')
end
local ctx = {timed = ARGV[2] == ''}
if ctx.timed then
  local t = redis.call('TIME')
  ctx.now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  ctx.now = int_arg(ARGV[2], 'now_us')
end
local cost = int_arg(ARGV[3], 'cost')
if cost < 0 then error('sluice: cost must not be negative') end
local limits = #KEYS
if limits == 0 or #ARGV ~= FIXED_ARGS + limits * PARAMS_PER_LIMIT then
  error('sluice: expected ' .. FIXED_ARGS .. ' + ' .. PARAMS_PER_LIMIT .. ' x ' .. limits ..
        ' arguments for ' .. limits .. ' keys, got ' .. #ARGV)
end

local algos, params = {}, {}
for i = 1, limits do
  local at = FIXED_ARGS + (i - 1) * PARAMS_PER_LIMIT + 1
  local code = ARGV[at]
  local algo = loaded[code]
  if algo == nil then
    local load = LOADERS[code]
    if load == nil then error('sluice: unknown algorithm code "' .. tostring(code) .. '"') end
    algo = load()
    loaded[code] = algo
  end
  algos[i] = algo
  params[i] = algo.params(ARGV, at)
end

if op == 'R' then
  local taken_at = int_arg(ARGV[4], 'taken_at_us')
  for i = 1, limits do
    if algos[i].refund then algos[i].refund(params[i], KEYS[i], ctx, taken_at, cost) end
  end
  return {ctx.now}
end

local reply = {ctx.now}
local plans = {}
local all_allowed = true
for i = 1, limits do
  local d, plan = algos[i].decide(params[i], KEYS[i], ctx, cost)
  plans[i] = plan
  if d.allowed == 0 then all_allowed = false end
  local n = #reply
  reply[n + 1] = d.allowed
  reply[n + 2] = d.limit
  reply[n + 3] = d.remaining
  reply[n + 4] = d.reset
  reply[n + 5] = d.retry
  reply[n + 6] = d.delay
end
if op == 'D' and all_allowed then
  for i = 1, limits do
    if plans[i] then algos[i].save(params[i], KEYS[i], plans[i], ctx) end
  end
end
return reply
