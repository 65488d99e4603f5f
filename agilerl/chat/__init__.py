"""Chat templates: incremental rendering, token for token the same as one full render
(``renderer``), and what frames an episode for the model (``episode``)."""

from agilerl.chat.episode import EPISODE_CHAT_KEYS, EpisodeChat
from agilerl.chat.renderer import ChatRenderer, render_chat

__all__ = ["EPISODE_CHAT_KEYS", "EpisodeChat", "render_chat", "ChatRenderer"]
