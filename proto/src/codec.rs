//! The codec the generated servers use: prost's encoding, except that a
//! request body that is not valid protobuf is the caller's fault, answered
//! `INVALID_ARGUMENT` with the decoder's message (tonic's own codec says
//! `INTERNAL`). The generated clients keep tonic's codec: a response that
//! does not decode is the server's fault, and `INTERNAL` says so.
//!
//! Errors in the gRPC framing around a message (a length prefix the stream
//! ends before filling, an invalid compression flag) are found by tonic
//! before any codec runs and stay `INTERNAL`, as the gRPC specification has
//! them.

use prost::Message;
use std::marker::PhantomData;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstEncoder};

/// A [`Codec`] encoding responses `T` and decoding requests `U` with prost.
#[derive(Debug, Clone)]
pub struct RequestCodec<T, U> {
    inner: ProstCodec<T, U>,
}

impl<T, U> Default for RequestCodec<T, U> {
    fn default() -> Self {
        Self {
            inner: ProstCodec::default(),
        }
    }
}

impl<T, U> Codec for RequestCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = RequestDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.inner.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder(PhantomData)
    }
}

/// Decodes requests `U`; a body that does not decode is `INVALID_ARGUMENT`.
#[derive(Debug, Clone, Default)]
pub struct RequestDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for RequestDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("malformed request: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}
