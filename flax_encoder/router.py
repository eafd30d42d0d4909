"""A sentence-transformers Router module: routes of modules (a query route, a document route),
one picked per call by its task, as sentence-transformers picks it for texts.

    router = read_router(folder, EmbeddingError)  # the folder modules.json's Router is in
    router.routes["query"]       # (RouteModule(name, type, folder), ...), in the order they run
    router.resolve("query")      # "query"; resolve(None): the route `encode` takes

What a route's modules compute is the reader's: `flax_encoder.embeddings` (a Transformer,
Pooling, Dense and Normalize a route) and `flax_encoder.sparse` (SPLADE, or a
SparseStaticEmbedding) read the routes and keep their own values in a Router of the same
resolution (`with_routes`). It imports no JAX.
"""

from __future__ import annotations

import ast
import dataclasses
import os
from collections.abc import Mapping
from typing import Generic, NamedTuple, TypeVar

from flax_encoder import modules_json

# modules.json's type of a Router: where sentence-transformers keeps the class (Asym: its name
# before 5).
ROUTERS = ("sentence_transformers.models.Router", "sentence_transformers.models.Asym",
           "sentence_transformers.base.modules.router.Router")
# The modality a text is of: sentence-transformers infers it from the inputs, and a route
# mapping may name it.
TEXT = "text"

R = TypeVar("R")


class RouteModule(NamedTuple):
  """A module of a route: its key in the Router's config (the folder it is saved in, inside
  the Router's), its type (modules.json's kind of name) and its folder."""
  name: str
  type: str
  folder: str


@dataclasses.dataclass(frozen=True, eq=False)
class Router(Generic[R]):
  """A Router's routes (route -> what the reader makes of its modules) and how a task picks
  one; `error` is the reader's error type, `file` the config the routes were read from."""
  routes: Mapping[str, R]
  default_route: str | None = None
  mappings: Mapping[tuple, str] = dataclasses.field(default_factory=dict)
  error: type[ValueError] = ValueError
  file: str = "the Router"

  def resolve(self, task: str | None) -> str:
    """The route of `task` (None: encode's; "query", "document") for texts: the mappings of
    (task, "text"), (task, any), (any, "text"), (any, any); else the route named `task`, the
    route named "text", the default route (with no task); as sentence-transformers'
    Router._resolve_route."""
    for key in ((task, TEXT), (task, None), (None, TEXT), (None, None)):
      if key in self.mappings:
        return self.mappings[key]
    if task and task in self.routes:
      return task
    if TEXT in self.routes:
      return TEXT
    if task is None and self.default_route is not None:
      return self.default_route
    raise self.error(f"task={task!r}: the Router has no route for it; its routes are "
                     f"{sorted(self.routes)}")

  def with_routes(self, routes: Mapping[str, R]) -> Router:
    """This Router's resolution over `routes` (the same names, other values)."""
    return dataclasses.replace(self, routes=dict(routes))


def read_router(folder: str, error: type[ValueError] = ValueError,
                files: modules_json.FolderFiles | None = None
                ) -> Router[tuple[RouteModule, ...]]:
  """The Router saved in `folder` (router_config.json, else config.json, as sentence-transformers
  reads it): each route's modules, its default_route (the first route where it names none and
  allow_empty_key is on) and route_mappings. Raises `error` (the caller's type) in one line
  naming the file. Its files are read through a load's `files`, where given."""
  file = os.path.join(folder, "router_config.json")
  config = modules_json.read_json(file, error, dict, files=files)
  if config is None:
    file = os.path.join(folder, "config.json")
    config = modules_json.read_json(file, error, dict, required=True, files=files)
  types, structure = config.get("types"), config.get("structure")
  parameters = config.get("parameters") or {}
  if not isinstance(types, dict) or not all(isinstance(t, str) for t in types.values()) or (
      not isinstance(structure, dict) or not structure or not all(
          isinstance(ids, list) and ids and all(isinstance(i, str) and i in types for i in ids)
          for ids in structure.values())) or not isinstance(parameters, dict):
    raise error(f"{file}: expected 'types' (module -> type), 'structure' (route -> its "
                f"modules, each in types) and 'parameters'")
  root = os.path.realpath(folder)
  for module in types:
    if not isinstance(module, str) or module in ("", ".") or "\0" in module or (
        os.path.commonpath([root, os.path.realpath(os.path.join(folder, module))]) != root):
      raise error(f"{file}: module {module!r} leads out of {folder}, expected a folder of it")
  routes = {route: tuple(RouteModule(i, types[i], os.path.join(folder, i)) for i in ids)
            for route, ids in structure.items()}
  default = parameters.get("default_route")
  if default is not None and (not isinstance(default, str) or default not in structure):
    raise error(f"{file}: default_route={default!r}, expected one of its routes "
                f"{sorted(structure)}")
  allow_empty = parameters.get("allow_empty_key", True)
  if not isinstance(allow_empty, bool):
    raise error(f"{file}: allow_empty_key={allow_empty!r}, expected true or false")
  if default is None and allow_empty:
    default = next(iter(structure))
  given = parameters.get("route_mappings") or {}
  if not isinstance(given, dict):
    raise error(f"{file}: route_mappings={given!r}, expected an object of '(task, modality)' "
                f"to routes")
  mappings = {}
  for key, route in given.items():
    try:
      task, modality = ast.literal_eval(key)
      # sentence-transformers sorts a modality of several (a text and an image) alike
      modality = tuple(sorted(modality)) if isinstance(modality, tuple) else modality
      hash((task, modality))  # a key of the mappings: no list in it
    except (ValueError, SyntaxError, TypeError):
      raise error(f"{file}: route_mappings key {key!r}, expected '(task, modality)'") from None
    if not isinstance(route, str) or route not in structure:
      raise error(f"{file}: route_mappings maps {key!r} to {route!r}, expected one of its "
                  f"routes {sorted(structure)}")
    mappings[(task, modality)] = route
  return Router(routes, default, mappings, error, file)
