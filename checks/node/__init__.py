"""Reading the node: sysfs, procfs and host files under injectable roots.

Each module reads one kind of kernel file and keeps reading apart from
parsing: `read_*` functions touch the filesystem, `parse_*` functions take
strings and are tested on literal text.
"""
