-- configpin: Argo CD health check of an apps/v1 DaemonSet, for argocd-cm's
-- resource.customizations.health.apps_DaemonSet, with
-- resource.customizations.useOpenLibs.apps_DaemonSet: "true" (it reads configpin's record
-- with Lua's string library, which Argo CD opens for a custom check only when asked).
--
-- Argo CD runs a custom check instead of its built-in one, so this one first says what the
-- built-in says (gitops-engine pkg/health/health_daemonset.go), then what configpin says on
-- the DaemonSet's own metadata: its rollout record (configpin.io/rollout, canonical JSON)
-- and configpin.io/held ("REASON: words"). The most urgent wins: configpin's rollout failed,
-- then the built-in Degraded, then paused (held Paused), then configpin
-- rolling or holding the change, then the built-in Progressing, then Healthy.
-- How to install it: docs/gitops.md.

-- >>> configpin's part: the same in the three files (the unit tests hold them to it)
local function map(v)
  if type(v) == "table" then return v end
  return {}
end

local function count(v)
  if type(v) == "number" then return v end
  return 0
end

local ESCAPES = { b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }

-- The string value of the record's field `key` (nil: none, or not a string). The record is
-- canonical JSON with no spaces, and a quote inside a string is always escaped, so '"key":"'
-- occurs only where that field's value starts.
local function field(text, key)
  local _, last = string.find(text, '"' .. key .. '":"', 1, true)
  if last == nil then return nil end
  local out, i = {}, last + 1
  while true do
    local at = string.find(text, '["\\]', i)
    if at == nil then return nil end
    out[#out + 1] = string.sub(text, i, at - 1)
    if string.sub(text, at, at) == '"' then return table.concat(out) end
    local e = string.sub(text, at + 1, at + 1)
    if e == "u" then
      local code = tonumber(string.sub(text, at + 2, at + 5), 16)
      out[#out + 1] = (code ~= nil and code < 128) and string.char(code) or "?"
      i = at + 6
    else
      out[#out + 1] = ESCAPES[e] or e
      i = at + 2
    end
  end
end

-- What configpin says of the workload: its rollout's state, signal and action, and what it
-- holds the change for (`held`: the reason, "" when it cannot be read; `words`).
local function configpin(obj)
  local notes = map(map(obj.metadata).annotations)
  local said = {}
  local record, held = notes["configpin.io/rollout"], notes["configpin.io/held"]
  if string == nil and (record ~= nil or held ~= nil) then
    said.unread = true  -- (Argo CD without useOpenLibs for this kind)
    return said
  end
  if type(record) == "string" then
    said.state = field(record, "state")
    said.signal = field(record, "signal")
    said.action = field(record, "action")
  end
  if type(held) == "string" then
    local reason, words = string.match(held, "^(%a+):%s*(.-)%s*$")
    said.held = reason or ""
    said.words = words or held
    if said.words == "" then said.words = said.held end
  end
  return said
end

local function failed(said)
  local text = "configpin: config rollout failed"
  if said.signal ~= nil and said.signal ~= "" then text = text .. ": " .. said.signal end
  if said.action ~= nil and said.action ~= "" then text = text .. " (" .. said.action .. ")" end
  return text
end
-- <<< configpin's part

-- Argo CD's built-in verdict (gitops-engine): status, message.
local function builtin(obj)
  local spec, status = map(obj.spec), map(obj.status)
  if count(map(obj.metadata).generation) > count(status.observedGeneration) then
    return "Progressing",
      "Waiting for rollout to finish: observed daemon set generation less than desired generation"
  end
  local desired, updated = count(status.desiredNumberScheduled), count(status.updatedNumberScheduled)
  local available = count(status.numberAvailable)
  if map(spec.updateStrategy).type == "OnDelete" then
    return "Healthy", "daemon set " .. updated .. " out of " .. desired .. " new pods have been updated"
  end
  local name = map(obj.metadata).name
  if type(name) ~= "string" then name = "" end
  if updated < desired then
    return "Progressing", 'Waiting for daemon set "' .. name .. '" rollout to finish: ' .. updated
      .. " out of " .. desired .. " new pods have been updated..."
  end
  if available < desired then
    return "Progressing", 'Waiting for daemon set "' .. name .. '" rollout to finish: '
      .. available .. " of " .. desired .. " updated pods are available..."
  end
  return "Healthy", ""
end

-- >>> the verdict: the same in the three files
local function health(obj)
  local status, message = builtin(obj)
  local said = configpin(obj)
  if said.unread then
    local kind = map(obj).kind
    if type(kind) ~= "string" then kind = "<kind>" end
    return status, "configpin: cannot read its annotations without Lua's string library "
      .. "(argocd-cm: resource.customizations.useOpenLibs.apps_" .. kind .. ': "true")'
      .. (message ~= "" and "; " .. message or "")
  end
  if said.state == "failed" then return "Degraded", failed(said) end
  if status == "Degraded" or status == "Suspended" then return status, message end
  if said.held == "Paused" then return "Suspended", "configpin: " .. said.words end
  if said.held == "Aborted" then return "Degraded", "configpin: " .. said.words end
  if said.state == "rolling" then return "Progressing", "configpin: config rollout in progress" end
  if said.held ~= nil then return "Progressing", "configpin: " .. said.words end
  return status, message
end

hs = {}
hs.status, hs.message = health(obj)
return hs
