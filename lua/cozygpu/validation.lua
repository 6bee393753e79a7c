--- cozygpu.validation — Kubernetes name and value rules, as the API server
--- applies them (k8s.io/apimachinery/pkg/util/validation/validation.go).
--- Each function returns nil when the value is valid, else a message in the
--- API server's words.
local M = {}

local function is_name_part(s)
  -- ([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]
  return s:match("^[A-Za-z0-9]$") ~= nil or s:match("^[A-Za-z0-9][-A-Za-z0-9_.]*[A-Za-z0-9]$") ~= nil
end

--- DNS-1123 label: at most 63 lowercase alphanumerics or '-', starting and
--- ending alphanumeric (IsDNS1123Label).
function M.dns1123_label(s)
  if type(s) ~= "string" then return "must be a string" end
  if #s == 0 or #s > 63 then return "must be 1 to 63 characters" end
  if not (s:match("^[a-z0-9]$") or s:match("^[a-z0-9][-a-z0-9]*[a-z0-9]$")) then
    return "must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"
  end
end

--- DNS-1123 subdomain: at most 253 characters, dot-separated DNS-1123
--- labels (IsDNS1123Subdomain).
function M.dns1123_subdomain(s)
  if type(s) ~= "string" then return "must be a string" end
  if #s == 0 or #s > 253 then return "must be 1 to 253 characters" end
  for part in (s .. "."):gmatch("(.-)%.") do
    if #part == 0 or not (part:match("^[a-z0-9]$") or part:match("^[a-z0-9][-a-z0-9]*[a-z0-9]$")) then
      return "must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
    end
  end
end

--- Qualified name: `[prefix/]name`, prefix a DNS-1123 subdomain, name at
--- most 63 characters of [-A-Za-z0-9_.] starting and ending alphanumeric
--- (IsQualifiedName). Used for label keys and toleration keys.
function M.qualified_name(s)
  if type(s) ~= "string" then return "must be a string" end
  local prefix, name = s:match("^([^/]*)/([^/]*)$")
  if not prefix then
    if s:find("/", 1, true) then return "a qualified name must consist of an optional DNS subdomain prefix and a name, separated by at most one '/'" end
    name = s
  elseif #prefix == 0 then
    return "prefix part must be non-empty"
  else
    local err = M.dns1123_subdomain(prefix)
    if err then return "prefix part " .. err end
  end
  if #name == 0 then return "name part must be non-empty" end
  if #name > 63 then return "name part must be no more than 63 characters" end
  if not is_name_part(name) then
    return "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
  end
end

--- Label value: empty, or at most 63 characters of [-A-Za-z0-9_.] starting
--- and ending alphanumeric (IsValidLabelValue).
function M.label_value(s)
  if type(s) ~= "string" then return "must be a string" end
  if #s == 0 then return nil end
  if #s > 63 then return "must be no more than 63 characters" end
  if not is_name_part(s) then
    return "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
  end
end

--- Extended resource name, as a device plugin advertises it: a qualified
--- name with a domain prefix outside kubernetes.io, such that
--- "requests." .. name is also a qualified name
--- (k8s.io/kubernetes pkg/apis/core/helper IsExtendedResourceName and
--- validation.ValidateResourceName).
function M.extended_resource_name(s)
  if type(s) ~= "string" then return "must be a string" end
  local prefix = s:match("^([^/]+)/")
  if not prefix then return "must be a domain-prefixed name such as nvidia.com/AD102GL_L40S" end
  if prefix == "kubernetes.io" or prefix:sub(-#".kubernetes.io") == ".kubernetes.io" then
    return "must not be in the kubernetes.io domain"
  end
  if s:sub(1, 9) == "requests." then return "must not start with 'requests.'" end
  local err = M.qualified_name(s) or M.qualified_name("requests." .. s)
  if err then return err end
end

return M
