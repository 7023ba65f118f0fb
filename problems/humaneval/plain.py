"""Plain Python data as JSON that keeps its types: a tuple stays a tuple, a set a set, bytes stay
bytes (the sandbox's own format turns tuples into lists). HumanEval's inputs go to the candidate
in it, and its answers come back in it.

Only builtins, no imports: the driver that runs beside the candidate holds a copy of this text
(`problems/humaneval/__init__.py`), so both sides read and write the same form.
"""

# Plain data nests at most this deep; the sandbox's format allows 100 levels, and each level
# here is two of its own.
DEPTH = 40
SCALARS = (type(None), bool, int, float, str)
SEQUENCES = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


def tag(value, depth=0):
    """`value` in the tagged form: a scalar as it is, a container as [its type's name, items];
    TypeError for anything else (an object of the program's own, whose == may say anything)."""
    kind = type(value)
    if kind in SCALARS:
        return value
    if depth >= DEPTH:
        raise TypeError("a returned value is nested too deeply")
    if kind in (list, tuple, set, frozenset):
        return [kind.__name__, [tag(item, depth + 1) for item in value]]
    if kind is dict:
        return ["dict", [[tag(k, depth + 1), tag(v, depth + 1)] for k, v in value.items()]]
    if kind is bytes:
        return ["bytes", value.hex()]
    if kind is complex:
        return ["complex", value.real, value.imag]
    raise TypeError(f"returned a {kind.__name__}, not plain Python data")


def untag(data, depth=0):
    """The value whose tagged form `data` is; ValueError where no value has that form."""
    kind = type(data)
    if kind in SCALARS:
        return data
    if kind is not list or not data or depth >= DEPTH:
        raise ValueError("not plain data in its tagged form")
    name, *parts = data
    try:
        if name in SEQUENCES and len(parts) == 1 and type(parts[0]) is list:
            return SEQUENCES[name]([untag(item, depth + 1) for item in parts[0]])
        if name == "dict" and len(parts) == 1 and type(parts[0]) is list:
            if not all(type(pair) is list and len(pair) == 2 for pair in parts[0]):
                raise ValueError("a malformed dict")
            return {untag(k, depth + 1): untag(v, depth + 1) for k, v in parts[0]}
        if name == "bytes" and len(parts) == 1 and type(parts[0]) is str:
            return bytes.fromhex(parts[0])
        if name == "complex" and len(parts) == 2 and all(type(p) is float for p in parts):
            return complex(parts[0], parts[1])
    except TypeError:  # an unhashable item in a set or a dict key
        raise ValueError("an unhashable set item or dict key") from None
    raise ValueError(f"not plain data in its tagged form ({str(name)[:20]!r})")
