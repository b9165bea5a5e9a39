"""A program's text and JSON forms: the lark grammar, the parser, the printer and the
JSON format.

Importing this package gives ``HostIrContainer`` its ``str()``, ``to_json`` and
``from_json`` (the IR does not import its text layer; see
``hostir.ir.container.register_text_forms``).
"""

from hostir.ir.container import register_text_forms
from hostir.text.json_format import from_json, to_json
from hostir.text.printer import print_program

register_text_forms(print_program=print_program, to_json=to_json, from_json=from_json)
