"""What of a config or a command line is a secret, and how it is written where others read it:
RUN/config.yaml, `--dry-run`, `ajet config`, the metrics sinks' copy (`ajet.config.to_yaml`),
RUN/.lock and its "in use" error (`redact_argv`), service command lines in the log. One rule:

- a setting whose name has a secret's word in it (`key`, `token`, `secret`, `password`, ...:
  `judge.params.api_key`, `serve.client_token`, `sandbox.service_token`) holds a secret, except
  the few that name something instead (`*_env`: an environment variable's name; NOT_SECRETS);
  plurals such as `max_tokens` or `public_metadata_keys` are counts and names, not secrets;
- every value of an environment map (`env_services.<name>.env`);
- in an argument list (`vllm_servers.<name>.extra_args`, `env_services.<name>.command`, argv), the
  value after a secret's flag (`--api-key X`, `--token=X`) and of a secret's override
  (`serve.client_token=X`);
- the password of a URL anywhere (`https://user:PASSWORD@host`, `redis://:PASSWORD@host`).

Such a value is written as REDACTED, unless it is an `${oc.env:NAME}` / `${file:PATH}`
interpolation (the loader writes a value that came from one back as it): that is no secret,
and a run that loads the saved config (a GPU backbone's workers) resolves it again. A secret
given literally reaches them as REDACTED: give secrets through the environment or a file.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

REDACTED = "<redacted>"
# The words of a setting's or a flag's name that make its value a secret.
SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "pwd", "credential",
                          "credentials", "authorization", "auth", "cookie"})
# Settings whose names match but that hold names, not secrets.
NOT_SECRETS = frozenset({"task_reader.curriculum.key"})
# Maps of environment variables: each of their values is treated as a secret (below the root: the
# root's `env` is the environment section, docs/environments.md).
ENV_MAP_KEYS = frozenset({"env"})
# Settings holding a command line (a string): secrets in it are redacted like argv's.
COMMAND_KEYS = frozenset({"command"})
# An interpolation shows no secret (an empty default included: `${oc.env:TOKEN,''}`).
_INTERPOLATION = re.compile(r"""\$\{(?:oc\.env|file):[^,}]*(?:,\s*(?:''|"")?)?\}""")


def is_secret_name(name: str) -> bool:
    """Whether a setting (dotted path or last part) or a flag (`--api-key`) names a secret."""
    if name.lstrip("-") in NOT_SECRETS:
        return False
    leaf = name.lstrip("-").rpartition(".")[2]
    words = re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", leaf).lower())
    return words[-1] != "env" and any(word in SECRET_WORDS for word in words)


def hide(value: str) -> str:
    """A secret's value as shown: an env/file interpolation as itself, anything else REDACTED."""
    return value if not value or _INTERPOLATION.fullmatch(value) else REDACTED


# A password inside a URL (`https://user:pass@host/...`, `redis://:pass@host`), in any value.
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)(?P<password>[^/\s@]+)(?=@)")


def hide_url_passwords(value: str) -> str:
    """`value` with the password of every URL in it hidden (the user name stays)."""
    return _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, value)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """`argv` with the value of each secret flag (`--api-key X`, `--token=X`) and each secret
    override (`serve.client_token=X`) hidden."""
    out: list[str] = []
    hide_next = False
    for arg in map(str, argv):
        if hide_next:
            out.append(hide(arg))
            hide_next = False
            continue
        name, eq, value = arg.partition("=")
        if eq and name and " " not in name and is_secret_name(name):
            out.append(f"{name}={hide(value)}")
        elif not eq and arg.startswith("-") and is_secret_name(arg):
            out.append(arg)
            hide_next = True
        else:
            out.append(hide_url_passwords(arg))
    return out


def redact_command(command: str) -> str:
    """A command line (a string) with its secret flags' values hidden; unchanged if it has none
    (or cannot be split)."""
    try:
        argv = shlex.split(command)
    except ValueError:  # unbalanced quotes: the launcher refuses it anyway
        return command
    redacted = redact_argv(argv)
    return command if redacted == argv else shlex.join(redacted)


def redact_config(tree: object, path: str = "") -> object:
    """A plain config tree (dicts, lists, scalars) with its secrets hidden (the module's rule)."""
    if isinstance(tree, dict):
        out: dict[object, object] = {}
        for key, value in tree.items():
            child = f"{path}.{key}" if path else str(key)
            if str(key) in ENV_MAP_KEYS and path and isinstance(value, dict):
                out[key] = {k: hide(v) if isinstance(v, str) else _hide_any(v) for k, v in value.items()}
            elif is_secret_name(child):
                out[key] = _hide_any(value)
            elif str(key) in COMMAND_KEYS and isinstance(value, str):
                out[key] = redact_command(value)
            else:
                out[key] = redact_config(value, child)
        return out
    if isinstance(tree, list):
        if tree and all(isinstance(v, str) for v in tree):
            return redact_argv(tree)
        return [redact_config(v, path) for v in tree]
    return hide_url_passwords(tree) if isinstance(tree, str) else tree


def _hide_any(value: object) -> object:
    """Every string under a secret's setting hidden (a number or a bool is no secret)."""
    if isinstance(value, str):
        return hide(value)
    if isinstance(value, dict):
        return {k: _hide_any(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hide_any(v) for v in value]
    return value
