"""Voice-agent framework plugins for cosyserve's streaming route, ``WS /v1/audio/speech/stream``.

Each framework lives in its own module, imported only when asked for, behind its own extra:
``pip install "cosyserve[livekit]"`` then ``from cosyserve_plugins.livekit import TTS``;
``pip install "cosyserve[pipecat]"`` then ``from cosyserve_plugins.pipecat import CosyserveTTSService``.
``protocol`` holds what every plugin shares: the route's messages and its error codes.
"""
