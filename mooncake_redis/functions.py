"""Moved: the library's building and loading to mooncake_redis.library, sending to mooncake_redis.transport."""
from .library import (
                      LIBRARY_NAME,
                      LIBRARY_PROTOCOL,
                      SCHEMA_FIELD,
                      SCHEMA_VERSION,
                      Library,
                      assemble,
                      check_schema,
                      ensure_loaded,
                      library,
                      library_source,
                      load,
                      locate_lines,
                      lua_dir,
                      module_name,
                      server_library,
                      stored_config,
)
from .transport.replies import FUNCTION_MISSING, error_of, finish, missing_functions, no_reply
from .transport.send import run

__all__ = ["LIBRARY_NAME", "LIBRARY_PROTOCOL", "SCHEMA_FIELD", "SCHEMA_VERSION", "Library", "assemble", "check_schema",
           "ensure_loaded", "library", "library_source", "load", "locate_lines", "lua_dir", "module_name",
           "server_library", "stored_config", "FUNCTION_MISSING", "error_of", "finish", "missing_functions", "no_reply",
           "run"]
