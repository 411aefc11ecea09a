"""Whether a JSON Schema admits any finite value, and if not, which field makes it impossible.

A grammar compiled from a schema whose required fields refer back to
themselves (`{"properties": {"next": {"$ref": "#"}}, "required": ["next"]}`)
is valid to llguidance, but every value it admits is infinitely deep: the
model would write `{"next": {"next": ...` until max_tokens and the answer
would be an unusable, cut-off value. Such a schema is refused up front.

The check is a least fixpoint over the schema's local `$ref` targets: a
subschema is satisfiable when some finite value fits it, assuming only targets
already shown satisfiable. It is a necessary condition, not a full validator
(keywords it does not model, such as patterns or numeric ranges, count as
satisfiable; llguidance judges those when it compiles the grammar).
"""

from typing import Any

_SCALAR_TYPES = {"null", "boolean", "integer", "number", "string"}


def unsatisfiable_field(schema: Any) -> str | None:
    """None when some finite value fits `schema`; else the path of the field that none can fill
    (dotted property names and [i] items from the root; "" for the root itself)."""
    targets = _local_ref_targets(schema)
    satisfiable: dict[str, bool] = dict.fromkeys(targets, False)
    changed = True
    while changed:  # monotone: targets only ever become satisfiable
        changed = False
        for pointer in targets:
            if not satisfiable[pointer] and _satisfiable(_resolve(schema, pointer), schema, satisfiable):
                satisfiable[pointer] = changed = True
    if _satisfiable(schema, schema, satisfiable):
        return None
    return _blame(schema, schema, satisfiable, "", {"#"})


def _satisfiable(node: Any, root: Any, known: dict[str, bool]) -> bool:
    if isinstance(node, bool):
        return node
    if not isinstance(node, dict):
        return True
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#") and not known.get(ref[1:], True):
        return False
    if "const" in node:
        return True
    if isinstance(node.get("enum"), list):
        return bool(node["enum"])
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list) and not any(_satisfiable(n, root, known) for n in node[key]):
            return False
    if isinstance(node.get("allOf"), list) and not all(_satisfiable(n, root, known) for n in node["allOf"]):
        return False
    types = node.get("type")
    types = [types] if isinstance(types, str) else types if isinstance(types, list) else None
    if types is None or any(t in _SCALAR_TYPES for t in types):
        return True
    return (("object" in types and _first_unfillable_property(node, root, known) is None)
            or ("array" in types and _first_unfillable_item(node, root, known) is None))


def _first_unfillable_property(node: dict, root: Any, known: dict[str, bool]) -> str | None:
    properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    for name in node.get("required") or ():
        if not isinstance(name, str):
            continue
        sub = properties.get(name, node.get("additionalProperties", True))
        if not _satisfiable(sub, root, known):
            return name
    return None


def _first_unfillable_item(node: dict, root: Any, known: dict[str, bool]) -> int | None:
    min_items = node.get("minItems", 0)
    if not isinstance(min_items, int) or min_items <= 0:
        return None
    prefix = node.get("prefixItems") if isinstance(node.get("prefixItems"), list) else []
    for i in range(min(min_items, len(prefix) + 1)):
        sub = prefix[i] if i < len(prefix) else node.get("items", True)
        if not _satisfiable(sub, root, known):
            return i
    return None


def _blame(node: Any, root: Any, known: dict[str, bool], path: str, seen: set[str]) -> str:
    """Follow an unsatisfiable node down to the field that cannot be filled."""
    if not isinstance(node, dict):
        return path
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#") and not known.get(ref[1:], True):
        if ref in seen:  # back at a node on this path: this field recurses for ever
            return path
        return _blame(_resolve(root, ref[1:]), root, known, path, seen | {ref})
    name = _first_unfillable_property(node, root, known)
    if name is not None:
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        sub = properties.get(name, node.get("additionalProperties", True))
        return _blame(sub, root, known, f"{path}.{name}" if path else name, seen)
    index = _first_unfillable_item(node, root, known)
    if index is not None:
        prefix = node.get("prefixItems") if isinstance(node.get("prefixItems"), list) else []
        sub = prefix[index] if index < len(prefix) else node.get("items", True)
        return _blame(sub, root, known, f"{path}[{index}]", seen)
    return path


def _local_ref_targets(node: Any) -> list[str]:
    """Every local "$ref" in `node`, as JSON pointers without the leading '#'."""
    found: list[str] = []
    stack = [node]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            ref = value.get("$ref")
            if isinstance(ref, str) and ref.startswith("#") and ref[1:] not in found:
                found.append(ref[1:])
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return found


def _resolve(root: Any, pointer: str) -> Any:
    """The node at a JSON pointer ("" is the root); a pointer that leads nowhere resolves to True
    (llguidance reports it when it compiles)."""
    node = root
    for part in pointer.split("/")[1:] if pointer else ():
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return True
    return node
