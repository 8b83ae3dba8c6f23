"""Type stubs of the ricochet package (the native module ricochet._native
and the exceptions of ricochet.errors)."""

from datetime import timedelta
from os import PathLike
from typing import AsyncIterator, Dict, List, Literal, Optional, Union

from .errors import AlreadyExistsError as AlreadyExistsError
from .errors import ClosedError as ClosedError
from .errors import DataLossError as DataLossError
from .errors import DisconnectedError as DisconnectedError
from .errors import FailedPreconditionError as FailedPreconditionError
from .errors import InternalError as InternalError
from .errors import InvalidArgumentError as InvalidArgumentError
from .errors import NotFoundError as NotFoundError
from .errors import OwnerDownError as OwnerDownError
from .errors import PermissionDeniedError as PermissionDeniedError
from .errors import PolicyError as PolicyError
from .errors import QueueFullError as QueueFullError
from .errors import RedirectError as RedirectError
from .errors import ResourceExhaustedError as ResourceExhaustedError
from .errors import RicochetError as RicochetError
from .errors import RicochetTimeoutError as RicochetTimeoutError
from .errors import StaleDeliveryError as StaleDeliveryError
from .errors import UnauthenticatedError as UnauthenticatedError
from .errors import UnavailableError as UnavailableError
from .errors import UnconfirmedError as UnconfirmedError

__version__: str

#: Seconds (int or float) or a timedelta.
Seconds = Union[int, float, timedelta]
Payload = Union[bytes, bytearray, str]
SubscriptionType = Literal["exclusive", "failover", "shared", "key_shared"]
FailureReason = Literal["nack", "ack_timeout", "consumer_lost", "reconsume_later", "terminate"]

class MessageId:
    """Where a message is stored: topic and per-topic entry id. Hashable."""

    @property
    def topic(self) -> str: ...
    @property
    def entry_id(self) -> int: ...
    @property
    def is_unknown(self) -> bool:
        """A de-duplicated resend whose original id the broker did not name."""

class Message:
    """One delivery of a message."""

    @property
    def id(self) -> MessageId: ...
    @property
    def topic(self) -> str:
        """The topic it was delivered from (main topic or retry tier)."""
    @property
    def payload(self) -> bytes: ...
    def text(self) -> str:
        """The payload as UTF-8 (UnicodeDecodeError if it is not)."""
    @property
    def key(self) -> Optional[str]: ...
    @property
    def properties(self) -> Dict[str, str]: ...
    @property
    def delivery_count(self) -> int:
        """Failed attempts before this delivery (0 the first time); kept by the broker."""
    @property
    def real_topic(self) -> Optional[str]:
        """REAL_TOPIC, on retry and dead-letter copies."""
    @property
    def origin_message_id(self) -> Optional[str]:
        """ORIGIN_MESSAGE_ID (`topic:entry_id`), on retry and dead-letter copies."""
    @property
    def reconsume_times(self) -> Optional[int]:
        """RECONSUMETIMES, on retry-tier copies."""
    @property
    def delay_time(self) -> Optional[float]:
        """DELAY_TIME in seconds, on retry-tier copies."""
    @property
    def is_retry(self) -> bool: ...
    @property
    def publish_time(self) -> float:
        """Seconds since the epoch."""
    @property
    def event_time(self) -> Optional[float]: ...
    @property
    def producer_name(self) -> str: ...
    @property
    def sequence_id(self) -> int: ...

class Producer:
    """Sends to one topic. Sends are queued in call order; concurrent sends
    (asyncio.gather) are pipelined and batched."""

    @property
    def topic(self) -> str: ...
    @property
    def name(self) -> str: ...
    async def send(
        self,
        payload: Payload,
        key: Optional[str] = None,
        properties: Optional[Dict[str, str]] = None,
        *,
        deliver_after: Optional[Seconds] = None,
        event_time: Optional[float] = None,
    ) -> MessageId:
        """Queues the message when called; resolves to its id once the broker
        stored it. Cancelling the await does not unsend it."""
    async def flush(self) -> None: ...
    async def close(self) -> None:
        """Flushes and closes; raises what was not answered. Later use raises ClosedError."""
    async def __aenter__(self) -> "Producer": ...
    async def __aexit__(self, *exc: object) -> None: ...

class Consumer:
    """Receives from one subscription: `async for msg in consumer`."""

    @property
    def topic(self) -> str: ...
    @property
    def subscription(self) -> str: ...
    @property
    def name(self) -> str: ...
    async def receive(self) -> Message:
        """The next message; ClosedError once closed."""
    def __aiter__(self) -> AsyncIterator[Message]: ...
    async def __anext__(self) -> Message: ...
    async def ack(self, msg: Message) -> None: ...
    async def ack_cumulative(self, msg: Message) -> None: ...
    async def nack(self, msg: Message, reason: Optional[str] = None) -> None:
        """Redelivered after the policy's delay for its next attempt, or dead-lettered."""
    async def reconsume_later(
        self,
        msg: Message,
        delay: Optional[Seconds] = None,
        level: Optional[int] = None,
        properties: Optional[Dict[str, str]] = None,
    ) -> None:
        """Through the retry tier: after `delay`, at delay `level`
        (-1 dead-letters, 0 the policy), or when the policy says."""
    async def terminate(self, msg: Message, reason: str) -> None:
        """Dead-letters at once; resolves when durable."""
    async def extend_ack_deadline(self, msg: Message) -> None: ...
    async def flush(self) -> None:
        """Waits until every ack so far is durable (UnconfirmedError otherwise)."""
    async def close(self) -> None: ...
    async def __aenter__(self) -> "Consumer": ...
    async def __aexit__(self, *exc: object) -> None: ...

class Client:
    @staticmethod
    async def connect(
        url: str,
        token: Optional[str] = None,
        tls_ca: Union[bytes, str, "PathLike[str]", None] = None,
        *,
        connect_timeout: Optional[Seconds] = None,
        request_timeout: Optional[Seconds] = None,
        reconnect_min: Optional[Seconds] = None,
        reconnect_max: Optional[Seconds] = None,
    ) -> "Client": ...
    @property
    def url(self) -> str: ...
    async def producer(
        self,
        topic: str,
        name: Optional[str] = None,
        *,
        batching: Optional[bool] = None,
        batch_max_messages: Optional[int] = None,
        batch_max_bytes: Optional[int] = None,
        batch_linger: Optional[Seconds] = None,
        send_timeout: Optional[Seconds] = None,
        max_pending_messages: Optional[int] = None,
        max_pending_bytes: Optional[int] = None,
        block_if_queue_full: Optional[bool] = None,
    ) -> Producer: ...
    async def consumer(
        self,
        topic: str,
        subscription: str,
        *,
        type: SubscriptionType = "exclusive",
        policy: Optional[str] = None,
        ack_timeout: Optional[Seconds] = None,
        initial_position: Literal["latest", "earliest"] = "latest",
        name: Optional[str] = None,
        receiver_queue_size: Optional[int] = None,
        negative_ack_delay: Optional[Seconds] = None,
        retry_topic: Optional[str] = None,
        dead_letter_topic: Optional[str] = None,
        retry_enabled: Optional[bool] = None,
        dead_letter_reader: bool = False,
        ack_receipts: bool = False,
        ack_group_time: Optional[Seconds] = None,
        broker_nack_threshold: Optional[Seconds] = None,
        local_redelivery: Optional[bool] = None,
        local_redelivery_budget: Optional[int] = None,
    ) -> Consumer: ...

class ScheduleRow:
    @property
    def attempt(self) -> int: ...
    @property
    def delay(self) -> Optional[float]:
        """Seconds before the redelivery; None for the dead letter."""
    @property
    def cumulative(self) -> float: ...
    @property
    def tier(self) -> Optional[Literal["main", "retry"]]: ...
    @property
    def dead_letter(self) -> bool: ...
    @property
    def outcome(self) -> str: ...

class PolicySchedule:
    """str() gives the table the CLI prints."""

    @property
    def spec(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def rows(self) -> List[ScheduleRow]: ...
    @property
    def truncated(self) -> bool: ...
    @property
    def table(self) -> str: ...

def parse_policy(spec: str) -> str:
    """The canonical compact form of `spec`; PolicyError if it does not validate."""

def explain_policy(spec: str, reason: FailureReason = "nack") -> PolicySchedule:
    """The schedule `spec` gives failures of `reason`, up to the dead letter."""
