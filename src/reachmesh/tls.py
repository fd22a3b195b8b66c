"""TLS contexts built from a policy's files: always verifying peers, and a file that cannot be
loaded is a ConfigError naming its policy key, raised when the Router is built rather than at the
first call that needs it."""

from __future__ import annotations

import ssl

from reachmesh.exceptions import ConfigError


def verifying_context(
    section: str, ca_file: str | None, client_cert_file: str | None, client_key_file: str | None
) -> ssl.SSLContext:
    """A client context that verifies against ``ca_file`` (else the system's CAs) and shows
    ``client_cert_file`` when set; ``section`` prefixes the key named in an error."""
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{section}.ca_file: cannot load {ca_file!r}: {exc}") from exc
    if client_cert_file is not None:
        try:
            context.load_cert_chain(client_cert_file, client_key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"{section}.client_cert_file: cannot load {client_cert_file!r}"
                f" (key {client_key_file or 'in the same file'}): {exc}"
            ) from exc
    return context
