"""Loading and storing names: locals, globals, closure cells, attributes, imports."""
from __future__ import annotations

import sys

from kiln.capture.breaks import GraphBreak
from kiln.capture.opcodes.registry import opcode
from kiln.capture.values.base import NULL
from kiln.capture.values.functions import CellValue
from kiln.capture.values.objects import ClassValue, PythonModuleValue, SuperValue
from kiln.capture.values.objects import store_global as store


@opcode("LOAD_FAST")
def load_fast(frame, ins):
    if ins.argval not in frame.locals:
        raise GraphBreak("exception", f"UnboundLocalError: {ins.argval!r}")
    frame.push(frame.locals[ins.argval])


@opcode("LOAD_FAST_AND_CLEAR", since=(3, 12))
def load_fast_and_clear(frame, ins):
    frame.push(frame.locals.pop(ins.argval, NULL))


@opcode("STORE_FAST")
def store_fast(frame, ins):
    value = frame.pop()
    if value is NULL:  # 3.12 comprehensions restore a variable that was unbound
        frame.locals.pop(ins.argval, None)
    else:
        frame.locals[ins.argval] = value


@opcode("DELETE_FAST")
def delete_fast(frame, ins):
    frame.locals.pop(ins.argval, None)


@opcode("LOAD_GLOBAL")
def load_global(frame, ins):
    if ins.method_load:
        frame.push(NULL)
    frame.push(frame.global_value(ins.argval))


@opcode("STORE_GLOBAL")
def store_global(frame, ins):
    store(frame.state, frame.globals, ins.argval, frame.pop())


@opcode("LOAD_DEREF", "LOAD_CLASSDEREF")
def load_deref(frame, ins):
    cell = frame.cells.get(ins.argval)
    if cell is None:
        raise GraphBreak("exception", f"free variable {ins.argval!r} referenced before assignment")
    frame.push(cell.load(frame.state))


@opcode("STORE_DEREF")
def store_deref(frame, ins):
    value = frame.pop()
    if ins.argval not in frame.cells:
        frame.cells[ins.argval] = CellValue(contents=value)
    else:
        frame.cells[ins.argval].store(frame.state, value)


@opcode("LOAD_CLOSURE")
def load_closure(frame, ins):
    frame.push(frame.cells[ins.argval])


@opcode("LOAD_ATTR")
def load_attr(frame, ins):
    obj = frame.pop()
    attr = obj.realize().getattr(frame.state, ins.argval)
    if ins.method_load:
        frame.push(NULL)
    frame.push(attr)


@opcode("LOAD_SUPER_ATTR", since=(3, 12))
def load_super_attr(frame, ins):
    self_value = frame.pop()
    cls = frame.pop()
    frame.pop()  # the global `super`
    attr = SuperValue(cls.as_constant(), self_value).getattr(frame.state, ins.argval)
    if ins.method_load:
        frame.push(NULL)
    frame.push(attr)


@opcode("STORE_ATTR")
def store_attr(frame, ins):
    obj = frame.pop()
    value = frame.pop()
    obj.realize().setattr(frame.state, ins.argval, value)


@opcode("DELETE_ATTR")
def delete_attr(frame, ins):
    frame.pop().realize().delattr(frame.state, ins.argval)


@opcode("IMPORT_NAME")
def import_name(frame, ins):
    level, fromlist = (v.as_constant() for v in frame.popn(2))
    name = ins.argval
    if level:
        raise GraphBreak("unsupported_call", f"relative import of {name!r}")
    if name not in sys.modules:
        raise GraphBreak("unsupported_call", f"import of {name!r}, not imported yet")
    # `import a.b` binds the top package; `from a.b import c` (a fromlist) reads c off a.b itself
    module = sys.modules[name] if fromlist else sys.modules[name.split(".")[0]]
    frame.push(PythonModuleValue(module))


@opcode("IMPORT_FROM")
def import_from(frame, ins):
    frame.push(frame.peek().getattr(frame.state, ins.argval))


@opcode("LOAD_ASSERTION_ERROR")
def load_assertion_error(frame, ins):
    frame.push(ClassValue(AssertionError))
