---@meta
-- cozygpu.validation — Kubernetes name and value rules as the API server
-- applies them (lua/cozygpu/validation.lua).
--
-- Source: k8s.io/apimachinery/pkg/util/validation/validation.go
-- (IsDNS1123Label, IsDNS1123Subdomain, IsQualifiedName, IsValidLabelValue);
-- k8s.io/kubernetes pkg/apis/core/helper IsExtendedResourceName and
-- pkg/apis/core/validation ValidateResourceName.
--
-- Each function returns nil when the value is valid, else one message in
-- the API server's words (the first problem found). A value that is not a
-- string gives "must be a string". None of them raises.

---@class cozygpu.validation
local validation = {}

---A DNS-1123 label: 1 to 63 characters, lower-case alphanumerics or '-',
---starting and ending alphanumeric (names of GPUClasses, namespaces).
---@param s any
---@return string? err
function validation.dns1123_label(s) end

---A DNS-1123 subdomain: 1 to 253 characters, dot-separated DNS-1123
---labels.
---@param s any
---@return string? err
function validation.dns1123_subdomain(s) end

---A qualified name `[prefix/]name`: the prefix a DNS-1123 subdomain, the
---name 1 to 63 characters of alphanumerics, '-', '_', '.', starting and
---ending alphanumeric. Label keys, annotation keys, toleration keys.
---@param s any
---@return string? err
function validation.qualified_name(s) end

---A label value: empty, or at most 63 characters of alphanumerics, '-',
---'_', '.', starting and ending alphanumeric.
---@param s any
---@return string? err
function validation.label_value(s) end

---An extended resource name as a device plugin advertises it
---(`nvidia.com/AD102GL_L40S`): a qualified name with a domain prefix
---outside kubernetes.io and *.kubernetes.io, not starting with
---"requests.", such that "requests." .. name is a qualified name too (the
---ResourceQuota key form).
---@param s any
---@return string? err
function validation.extended_resource_name(s) end

return validation
