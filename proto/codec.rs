//! The protobuf codec of every gyre.v1 method (client and server side):
//! tonic-prost's encoding, and its decoding except for the status of a
//! message that does not decode. tonic-prost answers INTERNAL, as if the
//! server had failed; here it is INVALID_ARGUMENT, the sender's fault, so a
//! client sending garbage (or nesting a `Struct` past prost's recursion
//! limit) is told so and an HTTP front maps it to a 400, never a 5xx.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

/// The codec `build.rs` names as the generated code's `codec_path`.
#[derive(Debug, Clone)]
pub struct GyreCodec<T, U> {
    _types: PhantomData<(T, U)>,
}

impl<T, U> Default for GyreCodec<T, U> {
    fn default() -> Self {
        Self {
            _types: PhantomData,
        }
    }
}

impl<T, U> Codec for GyreCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = GyreDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        GyreDecoder { _type: PhantomData }
    }
}

/// Decodes `U`; a message that does not decode is INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct GyreDecoder<U> {
    _type: PhantomData<U>,
}

impl<U: Message + Default> Decoder for GyreDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(malformed)
    }
}

/// The status of a message that is not valid protobuf of its type. prost's
/// error names the field path and the fault, never the bytes it was given.
pub fn malformed(e: prost::DecodeError) -> Status {
    Status::invalid_argument(format!("malformed protobuf message: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1;

    #[test]
    fn garbage_is_invalid_argument_and_valid_bytes_decode() {
        let garbage: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0x0f, 0x07];
        let status = v1::Request::decode(garbage)
            .map_err(malformed)
            .expect_err("garbage does not decode");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().starts_with("malformed protobuf message"));
        let good = v1::Request {
            model: "m".into(),
            ..Default::default()
        }
        .encode_to_vec();
        assert_eq!(
            v1::Request::decode(good.as_slice()).map(|r| r.model).ok(),
            Some("m".to_string())
        );
    }
}
