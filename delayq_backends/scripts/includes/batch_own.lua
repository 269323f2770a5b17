--[[ A batch's own keys, checked: anyone with the producer role can call the batch scripts with
keys of its choosing, so each script checks that the keys it was given are the batch's (named
after its hash) before it trusts them. Keyless.
MAX_MEMBERS bounds a batch's sub-jobs (store.batches.MAX_MEMBERS says the same), so counting a
batch's finished members stays bounded whatever is written into its sets by hand. ]]
local MAX_MEMBERS = 100000

-- Whether names[i] is the batch's key kinds[i] (e.g. 'batch_members'), for the batch whose
-- hash is hash and whose key is key: all share the hash's '<prefix>:{<tag>}:' head.
local function batch_own(hash, key, names, kinds)
  local tail = ':batch:' .. key
  if #hash <= #tail or string.sub(hash, -#tail) ~= tail then return false end
  local head = string.sub(hash, 1, #hash - #tail)
  for i = 1, #names do
    if names[i] ~= head .. ':' .. kinds[i] .. ':' .. key then return false end
  end
  return true
end
