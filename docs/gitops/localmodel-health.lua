-- Argo CD health check for localmodel.dev/LocalModel (docs/gitops.md).
-- The same verdicts as kstatus (sigs.k8s.io/cli-utils, what Flux uses):
--   kstatus InProgress = Progressing, Current = Healthy, Failed = Degraded.
-- Reads only what the operator writes: status.observedGeneration and the
-- conditions Reconciling / Stalled (present while True), Ready.
local hs = {}
local meta = obj.metadata or {}
local st = obj.status

if meta.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "being deleted"
  return hs
end
if st == nil then
  -- Only with a CRD older than the chart's: it defaults observedGeneration to 0.
  hs.status = "Progressing"
  hs.message = "waiting for the operator's first status"
  return hs
end
if meta.generation ~= nil and st.observedGeneration ~= nil
    and st.observedGeneration ~= meta.generation then
  hs.status = "Progressing"
  hs.message = string.format(
    "LocalModel generation is %d, but latest observed generation is %d",
    meta.generation, st.observedGeneration)
  return hs
end

local conditions = st.conditions or {}
local function said(c)
  local text = c.reason or ""
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end

for _, c in ipairs(conditions) do
  if c.type == "Reconciling" and c.status == "True" then
    hs.status = "Progressing"
    hs.message = said(c)
    return hs
  end
  if c.type == "Stalled" and c.status == "True" then
    hs.status = "Degraded"
    hs.message = said(c)
    return hs
  end
end
for _, c in ipairs(conditions) do
  if c.type == "Ready" then
    if c.status == "True" then
      hs.status = "Healthy"
    else
      hs.status = "Progressing"
    end
    hs.message = said(c)
    return hs
  end
end
hs.status = "Healthy"
hs.message = "no conditions"
return hs
