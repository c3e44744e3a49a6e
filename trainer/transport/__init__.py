"""Framed, authenticated request/reply transport over TCP (numpy and the standard library only).

    wire      -- frames, the array codec, limits, the HMAC handshake, the error classes
    endpoint  -- AuthenticatedServer / AuthenticatedClient, which the parameter
                 server (trainer.ps) and the model hopper (trainer.selection.hopper) extend

It knows nothing about what the frames mean.
"""
