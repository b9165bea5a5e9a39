"""A program's text and JSON forms: the lark grammar, the parser, the printer and the JSON
format. Importing this package gives ``HostIrContainer`` its ``str()`` and JSON methods.
"""
