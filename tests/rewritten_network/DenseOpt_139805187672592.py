import sys
import mindspore
from mindspore import nn
from mindspore.nn import Cell
from mindspore.ops import functional as F
#
#
sys.path.insert(0, '/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/mindspore/nn/layer')
from mindspore import ops
from mindspore.nn.cell import Cell
from mindspore.nn.layer.basic import Dense
from mindspore.train.amp import amp_cast

class DenseOpt(Dense, Cell):

    def __init__(self, obj):
        Cell.__init__(self)
        for key, value in obj.__dict__.items():
            setattr(self, key, value)

    def construct(self, x):
        x_shape = self.shape_op(x)
        len_var_1 = len(x_shape)
        compare_var_1 = len_var_1 != 2
        if compare_var_1:
            subscript_var = x_shape[-1]
            usub_var = -1
            tuple_var = (usub_var, subscript_var)
            x = self.reshape(x, tuple_var)
        x_var = amp_cast(x, mindspore.float16)
        weight_var = amp_cast(self.weight, mindspore.float16)
        x = self.matmul(x_var, weight_var)
        x = amp_cast(x, mindspore.float32)
        if self.has_bias:
            x = self.bias_add(x, self.bias)
        if self.activation_flag:
            x = self.activation(x)
        len_var = len(x_shape)
        compare_var = len_var != 2
        if compare_var:
            subscript_var_2 = ops.shape(x)[-1]
            tuple_var_1 = (subscript_var_2,)
            subscript_var_1 = x_shape[:-1]
            out_shape = subscript_var_1 + tuple_var_1
            x = self.reshape(x, out_shape)
        return x

    def extend_repr(self):
        s = f'input_channels={self.in_channels}, output_channels={self.out_channels}'
        if self.has_bias:
            s += f', has_bias={self.has_bias}'
        if self.activation_flag:
            s += f', activation={self.activation}'
        return s
#