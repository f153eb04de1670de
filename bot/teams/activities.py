"""Teams activities as typed values: what the chat core will need from an incoming activity, parsed once.

Shapes from Microsoft's "Channel and group chat conversations with a bot" and "Get Teams-specific context for your
bot" pages: `conversation.conversationType` is "personal", "groupChat" or "channel"; in a channel the conversation
id carries the thread (`19:…@thread.tacv2;messageid=<root message id>`), and `channelData` names the team, the
channel and the tenant; the user is `from.aadObjectId` (stable; the 29: id is per bot) and an @mention of the bot is
`<at>Name</at>` in the text with a `mention` entity. Feedback clicks are `invoke` activities named
`message/submitAction` whose value has actionName "feedback" ("Feedback buttons" in the Teams AI docs).
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

ConversationType = Literal["personal", "groupChat", "channel"]
Reaction = Literal["like", "dislike"]

_AT = re.compile(r"<at[^>]*>(.*?)</at>", re.IGNORECASE | re.DOTALL)
_TAGS = re.compile(r"<[^>]+>")


def base_conversation_id(conversation_id: str) -> str:
    """The channel or chat itself, without the `;messageid=` thread part."""
    return conversation_id.split(";", 1)[0]


def thread_root_of(conversation_id: str) -> str | None:
    """The root message id a channel conversation id names (`;messageid=<id>`), if any."""
    for part in conversation_id.split(";")[1:]:
        key, _, value = part.partition("=")
        if key.strip().lower() == "messageid" and value:
            return value
    return None


def thread_conversation_id(conversation_id: str, root_id: str) -> str:
    """The conversation id that posts into a channel thread: a reply sent with the bare channel id (and only
    `replyToId`) would become a new top-level post."""
    return f"{base_conversation_id(conversation_id)};messageid={root_id}"


@dataclass(frozen=True)
class TeamsUser:
    id: str  # the 29: id (per bot)
    aad_object_id: str | None  # the Microsoft Entra object id: the stable key (identity "teams:<aadObjectId>")
    name: str

    @property
    def identity(self) -> str:
        return f"teams:{self.aad_object_id or self.id}"


@dataclass(frozen=True)
class TeamsConversation:
    """Where an activity happened and where its answer goes."""

    id: str  # as Teams sent it (a channel's with ";messageid=")
    type: ConversationType
    tenant_id: str | None
    service_url: str
    team_id: str | None = None
    channel_type: str | None = None  # a channel's membership type when Teams says: "standard", "private", "shared"
    # The team's Microsoft 365 group id (channelData.team.aadGroupId): Microsoft Graph's team id (bot.teams.owners).
    team_group_id: str | None = None

    @property
    def base_id(self) -> str:
        return base_conversation_id(self.id)

    @property
    def is_personal(self) -> bool:
        return self.type == "personal"

    @property
    def is_restricted(self) -> bool:
        """Read only by its members: a group chat, or a private or shared channel. A standard channel is open to
        its whole team (and a public team to anyone who joins): it answers from everyone + grants."""
        return self.type == "groupChat" or (self.type == "channel" and self.channel_type in ("private", "shared"))

    @property
    def channel_key(self) -> str:
        """The chat core's channel key ("teams:<tenant>:<conversation>"); settings and grants hang on it."""
        return f"teams:{self.tenant_id or '-'}:{self.base_id}"


@dataclass(frozen=True)
class TeamsMessage:
    """A person's message to the bot."""

    activity_id: str
    text: str  # the question: the bot's @mention removed, markup stripped
    conversation: TeamsConversation
    user: TeamsUser
    mentions_bot: bool
    reply_to_id: str | None = None
    # A click on an Adaptive Card's Action.Submit button: Teams sends a message activity whose `value` is the
    # action's `data` object, with no text ("Card actions", Adaptive Cards actions: learn.microsoft.com/
    # microsoftteams/platform/task-modules-and-cards/cards/cards-actions); `reply_to_id` is the card's message.
    action: dict[str, Any] | None = None

    @property
    def thread_root(self) -> str | None:
        """The channel thread this message is in: the root the conversation id names, or the message itself when
        it is a new post. None in a chat (chats have no threads)."""
        if self.conversation.type != "channel":
            return None
        return thread_root_of(self.conversation.id) or self.activity_id

    @property
    def starts_thread(self) -> bool:
        return self.conversation.type == "channel" and self.thread_root == self.activity_id

    @property
    def reply_conversation_id(self) -> str:
        """Where the answer goes: the thread in a channel, the chat itself elsewhere."""
        root = self.thread_root
        return thread_conversation_id(self.conversation.id, root) if root else self.conversation.id


@dataclass(frozen=True)
class TeamsFeedback:
    """A 👍/👎 on one of the bot's messages."""

    reaction: Reaction
    text: str  # what the user typed in the feedback form, if anything
    message_id: str  # the bot message rated (the invoke's replyToId)
    conversation: TeamsConversation
    user: TeamsUser


@dataclass(frozen=True)
class TeamsMembershipChange:
    """People joined or left a conversation (a `conversationUpdate` with membersAdded / membersRemoved: in a team,
    channelData.eventType teamMemberAdded / teamMemberRemoved): a restricted conversation's audience is read
    again at the next question, as Slack's member_joined_channel does."""

    conversation: TeamsConversation
    added: tuple[str, ...]  # 29: ids (the bot's own id when it was installed)
    removed: tuple[str, ...]


TeamsEvent = TeamsMessage | TeamsFeedback | TeamsMembershipChange


def _conversation(data: dict[str, Any]) -> TeamsConversation | None:
    conversation = data.get("conversation") or {}
    conversation_id = conversation.get("id")
    if not conversation_id or not data.get("serviceUrl"):
        return None
    channel_data = data.get("channelData") or {}
    kind: ConversationType
    match conversation.get("conversationType") or ("groupChat" if conversation.get("isGroup") else "personal"):
        case "personal":
            kind = "personal"
        case "groupChat":
            kind = "groupChat"
        case "channel":
            kind = "channel"
        case _:
            return None
    tenant = conversation.get("tenantId") or (channel_data.get("tenant") or {}).get("id")
    channel = channel_data.get("channel") or {}
    channel_type = channel.get("type") or channel.get("membershipType")
    return TeamsConversation(
        id=str(conversation_id), type=kind, tenant_id=tenant, service_url=str(data["serviceUrl"]),
        team_id=(channel_data.get("team") or {}).get("id"),
        channel_type=str(channel_type).lower() if channel_type else None,
        team_group_id=(channel_data.get("team") or {}).get("aadGroupId"),
    )


def _user(data: dict[str, Any]) -> TeamsUser | None:
    sender = data.get("from") or {}
    if not sender.get("id"):
        return None
    return TeamsUser(str(sender["id"]), sender.get("aadObjectId"), str(sender.get("name") or ""))


def question_text(text: str, bot_names: set[str] | None = None) -> tuple[str, bool]:
    """The question without the bot's `<at>…</at>` mention (other people's mentions keep their names), markup
    stripped and entities decoded; and whether the bot was mentioned."""
    mentioned = False

    def replace(match: re.Match[str]) -> str:
        nonlocal mentioned
        name = html.unescape(match.group(1)).strip()
        if bot_names is None or name in bot_names:
            mentioned = True
            return " "
        return name

    plain = _AT.sub(replace, text or "")
    plain = html.unescape(_TAGS.sub(" ", plain))
    return " ".join(plain.split()), mentioned


def parse_activity(data: dict[str, Any], bot_id: str) -> TeamsEvent | None:
    """A person's message or feedback click, or None for everything the bot ignores (its own messages, typing,
    conversation updates, other invokes)."""
    conversation, user = _conversation(data), _user(data)
    if data.get("type") == "conversationUpdate" and conversation is not None:
        added = tuple(str(m.get("id")) for m in data.get("membersAdded") or [] if m.get("id"))
        removed = tuple(str(m.get("id")) for m in data.get("membersRemoved") or [] if m.get("id"))
        return TeamsMembershipChange(conversation, added, removed) if added or removed else None
    if conversation is None or user is None or user.id == bot_id:
        return None
    if data.get("type") == "message":
        mention_names = {str(e.get("text") or "") for e in data.get("entities") or []
                         if e.get("type") == "mention" and (e.get("mentioned") or {}).get("id") == bot_id}
        names = {html.unescape(_AT.sub(lambda m: m.group(1), n)).strip() for n in mention_names}
        text, mentioned = question_text(str(data.get("text") or ""), names)
        value = data.get("value")
        return TeamsMessage(str(data.get("id") or ""), text, conversation, user, mentioned or bool(mention_names),
                            data.get("replyToId"), value if isinstance(value, dict) and not text else None)
    if data.get("type") == "invoke" and data.get("name") == "message/submitAction":
        value = data.get("value") or {}
        if value.get("actionName") != "feedback":
            return None
        action = value.get("actionValue") or {}
        reaction = action.get("reaction")
        if reaction not in ("like", "dislike") or not data.get("replyToId"):
            return None
        typed = ""
        try:
            typed = str((json.loads(action.get("feedback") or "{}") or {}).get("feedbackText") or "")
        except (ValueError, AttributeError):
            typed = ""
        return TeamsFeedback(reaction, typed, str(data["replyToId"]), conversation, user)
    return None
