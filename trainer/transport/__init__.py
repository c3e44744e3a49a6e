"""Framed, authenticated request/reply transport over TCP (numpy and the standard library only).

    wire       -- frames, the array codec, limits, the error classes
    session    -- a sequence number and a MAC after every frame once a connection is authenticated
    libcrypto  -- Poly1305 from the system's OpenSSL through ctypes (no GIL held while it hashes)
    overlap    -- a helper thread per connection that hashes a frame while it moves
    handshake  -- mutual authentication (both sides prove the secret over both nonces), session keys,
                  Credentials (what a task needs: secret, MAC algorithm, TLS fingerprint)
    tls        -- optional TLS with a throw-away certificate per run, pinned by its fingerprint
    endpoint   -- AuthenticatedServer (admission, one thread per connection)
    client     -- AuthenticatedClient (connect, retry while busy, request/reply)
                  The parameter server (trainer.ps) and the model hopper (trainer.selection.engine.hopper) extend both.

It knows nothing about what the frames mean.
"""
