"""The program's data types: meshes, scalars, shardings, values, instructions,
communications and the container that holds a program. Imports nothing of hostir but
``hostir.errors``.
"""
