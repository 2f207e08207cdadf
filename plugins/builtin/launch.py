"""How the built-in backend gets its engine: loaded in this process (`load_engine`), in an engine
process it starts and supervises (`start_engine_process`), or in one engine process started once
for all the workers of a server (`share_engine`, the backend type's `share`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from plugins.contract.errors import ConfigError

if TYPE_CHECKING:
    from builtin_engine.config import EngineConfig
    from builtin_engine.process.calls import EngineLaunch
    from builtin_engine.process.service import EngineService
    from builtin_engine.process.supervisor import EngineSupervisor
    from plugins.builtin.options import BuiltinOptions


def engine_launch(name: str, options: BuiltinOptions) -> EngineLaunch:
    """The checkpoint (fetched and converted once when `model` is a known name) and the engine
    settings of a backend's options; a bad option is a `ConfigError` naming it."""
    from builtin_engine.model.store import ModelStoreError, resolve_model
    from builtin_engine.process.calls import EngineLaunch

    where = f"backend {name!r}, [backends.options]"
    try:
        model_dir = resolve_model(options.model)
    except ModelStoreError as exc:
        raise ConfigError(f"{where} model: {exc}") from exc
    try:
        config = _engine_config(options)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    return EngineLaunch(model_dir=str(model_dir), config=config)


def _engine_config(options: BuiltinOptions) -> EngineConfig:
    """The engine settings are the backend options of the same names (an engine setting no option
    names keeps its default), so a new engine option needs its `BuiltinOptions` field only."""
    from dataclasses import fields

    from builtin_engine.config import EngineConfig

    given = msgspec.structs.asdict(options)
    return EngineConfig(**{f.name: given[f.name] for f in fields(EngineConfig) if f.name in given})


def load_engine(name: str, launch: EngineLaunch) -> EngineService:
    """The engine in this process (blocking: loads the weights)."""
    from builtin_engine.errors import UnsupportedModelError
    from builtin_engine.process.service import EngineService
    from builtin_engine.text.tokenizer import TokenizerError

    where = f"backend {name!r}, [backends.options]"
    try:
        return EngineService.load(launch)
    except (TokenizerError, UnsupportedModelError) as exc:
        raise ConfigError(f"{where} model: {exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def start_engine_process(name: str, launch: EngineLaunch, options: BuiltinOptions) -> EngineSupervisor:
    """Start the backend's engine process and its supervisor (blocking, until it serves)."""
    from builtin_engine.process.supervisor import EngineLaunchError, EngineSupervisor

    supervisor = EngineSupervisor(name, launch, start_timeout_s=options.engine_start_timeout_s)
    try:
        supervisor.start()
    except EngineLaunchError as exc:
        supervisor.close()
        where = f"backend {name!r}, [backends.options]"
        raise ConfigError(f"{where} {exc.param}: {exc.message}" if exc.param else f"{where}: {exc.message}") from exc
    return supervisor


@dataclass
class SharedEngine:
    """The engine process one server shares between its workers (`BackendType.share`)."""

    supervisor: EngineSupervisor
    options: BuiltinOptions  # the workers' options: `engine_address` set

    def close(self) -> None:
        self.supervisor.close()


def share_engine(name: str, options: BuiltinOptions) -> SharedEngine | None:
    """Start one engine process for every worker of the server (unless `engine_process = false`,
    or an address is given)."""
    if options.engine_process is False or options.engine_address is not None:
        return None
    supervisor = start_engine_process(name, engine_launch(name, options), options)
    return SharedEngine(supervisor, msgspec.structs.replace(options, engine_process=True, engine_address=supervisor.address))
